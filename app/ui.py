"""The app assembled: the page (the shared components and one module per tab, `app.tabs`), what a new image does
across the tabs (`ImageEvents`: its first view, the follow-up, what the open tab computes), the events wired,
the /analyze endpoint, the queue, and launch.

Each browser session has its own model (a `ModelChoice` in gr.State), served from one `ModelCache` shared by all
sessions and all work (the Dataset tab's atlas too). One public API endpoint, `/analyze`, answers with the
server's default model.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator

import gradio as gr

from app import session, style, texts, torch_thread
from app.api import Analyze, CompareImage
from app.api_calls import guard_api_calls
from app.choices import top_predictions
from app.examples import served_paths
from app.images import MAX_RECEIVED_MB, MAX_UPLOAD_MB, STAND_IN_JS, ImageInputError, payload_path
from app.models import LoadedModel, ModelCache, ModelChoice
from app.page_tab import PageTab
from app.shared import (
    CAUSAL_TAB,
    CLASS_ATTENTION_TAB,
    LONG_EVENTS,
    MECHANISMS_TAB,
    MODEL_EVENTS,
    NO_BOUNDS_CHECK,
    ImageAsk,
    Look,
    Shared,
    answering,
    named,
    within,
)
from app.tabs import causal, class_attention, compare, dataset, layerscale, mechanisms, model, saliency, talking_heads
from app.tabs.compare import COMPARE_TAB
from app.workdir import FILE_TTL, WORK
from cait import hub
from cait.explain.maps import DEFAULT_SHARE

log = logging.getLogger("cait.app")
CONCURRENCY = 2  # model runs at once (all model events share one concurrency group)
QUEUE_SIZE = 64  # waiting requests beyond this are refused: memory stays bounded
STATE_TTL = 3600  # seconds a session's analysis is kept
# Run in the browser before the follow-up is sent: wait (at most 3 s) until the class-attention tiles on screen
# are decoded, so that the follow-up's work does not compete with the browser fetching them; the inputs go on
# unchanged. Timers, not animation frames, which a background tab never gets.
AFTER_TILES_SHOWN = """async (...inputs) => {
    const pause = () => new Promise(r => setTimeout(r, 15));
    await pause();  // let the page draw the new gallery values first
    const shown = () => [...document.querySelectorAll('.ca-grid img')].filter(t => t.offsetParent !== null);
    const until = performance.now() + 3000;
    while (!shown().every(t => t.complete) && performance.now() < until) await pause();
    return inputs;
}"""
THEME = dict(font=["DejaVu Sans", "sans-serif"], font_mono=["DejaVu Sans Mono", "monospace"])  # local fonts only
# The page's tabs in order: (label, id, components, events); each events class a `PageTab`, which the page loops
# over in every step of a new image or model. A new tab is a module of `app.tabs` and one line here.
TABS = (
    (CLASS_ATTENTION_TAB, "ca", class_attention.build, class_attention.ClassAttentionTab),
    ("Saliency", "saliency", saliency.build, saliency.SaliencyTab),
    ("LayerScale", "layerscale", layerscale.build, layerscale.LayerScaleTab),
    ("Talking heads", "talking", talking_heads.build, talking_heads.TalkingHeadsTab),
    (CAUSAL_TAB, "causal", causal.build, causal.CausalTab),
    (MECHANISMS_TAB, "mechanisms", mechanisms.build, mechanisms.MechanismsTab),
    ("Dataset", "dataset", dataset.build, dataset.DatasetTab),
    (COMPARE_TAB, "compare", compare.build, compare.CompareTab),
    ("Model", "model", model.build, model.ModelTab),
)


@dataclass
class Page:
    """The page's components: the shared ones and each tab's by its id (`page.causal`: the Causal tab's)."""

    shared: Shared
    parts: dict[str, Any]  # in the page's order (`TABS`)

    def __getattr__(self, name: str) -> Any:
        if name in self.__dict__.get("parts", {}):
            return self.__dict__["parts"][name]
        raise AttributeError(name)

    def look(self) -> dict[str, Any]:
        """The Class attention tab's look controls by name, which other events read too."""
        return dict(zip(("cmap", "alpha", "scale", "view", "keep"), self.ca.look))

    def everything(self) -> list:
        """Every component a new model may write: the shared ones and every tab's but those it leaves as they are
        (`PageTab.kept_on_new_model`: an open atlas)."""
        kept = {tab_id for _, tab_id, _, events in TABS if events.kept_on_new_model}
        found = []
        for group in (self.shared, *(v for k, v in self.parts.items() if k not in kept)):
            for f in fields(group):
                value = getattr(group, f.name)
                found += value if isinstance(value, list) else [value]
        return [c for c in found if isinstance(c, gr.blocks.Block)]


@dataclass(frozen=True)
class DetailsAsk:
    """What the follow-up of a new image (`ImageEvents.details`) is sent, each field named as its component."""

    choice: ModelChoice
    analysis: session.Analysis | None
    cmap: str  # how class attention is drawn (the Class attention tab's look)
    alpha: float
    scale: str
    view: str
    keep: float
    th_layer: int  # the talking-heads layer and query patch, as the page sent them (clamped at the door)
    th_row: int
    th_col: int
    region_of: str | None  # the map whose region of focus is drawn
    region_share: float = DEFAULT_SHARE  # the share of its attention mass the region of focus holds

    @property
    def look(self) -> Look:
        return Look(self.cmap, self.alpha, self.scale, self.view, self.keep)


@dataclass(frozen=True)
class UploadAsk(ImageAsk):
    """What an upload sends (by name): `ImageAsk`'s fields and the upload's payload."""

    image_in: Any = None


class Tabs:
    """Every tab's events, on one page's components (`tabs.causal`: the Causal tab's), and what the tabs' events
    are made with (`PageTab.on_page`)."""

    def __init__(self, page: Page, cache: ModelCache, default: ModelChoice, places: dataset.AtlasPlaces, ca: int):
        self.shared, self.cache, self.default, self.places, self.ca_layers = page.shared, cache, default, places, ca
        self.image = ImageEvents(page, self, cache)
        self.by_id = {tab_id: events.on_page(page.parts[tab_id], self) for _, tab_id, _, events in TABS}
        self.by_label = {label: self.by_id[tab_id] for label, tab_id, _, _ in TABS}
        self.all: list[PageTab] = list(self.by_id.values())

    def __getattr__(self, name: str) -> Any:
        if name in self.__dict__.get("by_id", {}):
            return self.__dict__["by_id"][name]
        raise AttributeError(name)


def unselected(*galleries: gr.Gallery) -> dict:
    """No tile of `galleries` framed as the page's image any more: their props only, their tiles stay (a
    component, not gr.update, which drops a None)."""
    return {gallery: gr.Gallery(selected_index=None) for gallery in galleries}


def tab_opened(evt: gr.SelectData) -> str:
    """The label of the tab the page shows now."""
    return evt.value


class ImageEvents:
    """What a new image (or a new model) does across the tabs: each tab's part, composed."""

    def __init__(self, page: Page, tabs: Tabs, cache: ModelCache):
        self.page, self.tabs, self.cache = page, tabs, cache

    def results(self) -> list:
        """What analysing an image writes: its results in every tab (all of them, none left to be skipped: Gradio
        rebuilds a skipped output's component as if its props had changed). The class menus are among them: the
        first view empties their value only (the choices, 1000 for ImageNet, are sent by `details` with the new
        image's class), so an image that failed keeps no class of the last one, and a new one starts from its top
        class."""
        s = self.page.shared
        return [
            s.analysis,
            s.top5,
            s.status,
            s.grid_file,
            s.json_file,
            *(c for t in self.tabs.all for c in t.results()),
        ]

    def cleared(self, shown: tuple, status: str = "") -> dict:
        """Every result of the last image emptied (a removed image, a new model, a file that failed); shown: the CA
        galleries' props as the page has them."""
        s = self.page.shared
        out = dict.fromkeys(self.results()) | {s.top5: "", s.status: status}
        for tab in self.tabs.all:
            out |= tab.cleared(shown)
        return out

    def emptied(self, shown: tuple) -> dict:
        """What a new model empties of the page's image: the image box and its results (`page_for`'s part that an
        image asked before a ?model= swap answers itself)."""
        return self.cleared(shown) | {self.page.shared.image_in: None}

    def page_for(self, loaded: LoadedModel, shown: tuple) -> dict:
        """Everything on the page that a new model changes: the last image's results emptied, every control
        that depends on the model set for `loaded`."""
        s = self.page.shared
        out = self.emptied(shown)
        out |= {
            s.choice: loaded.choice,
            s.header: texts.header_markdown(loaded, hub.cached_variants()),
            s.examples: gr.Gallery(value=loaded.examples),
        }
        for tab in self.tabs.all:
            out |= tab.for_model(loaded)
        return out

    def image_changed(self, image: object, shown: tuple) -> dict:
        """The image box emptied: by its remove button, or by the browser refusing a file over what the server
        takes (`MAX_RECEIVED_MB`), which sends no clear event. The last image's results go with it; a new image
        changes nothing here."""
        if image is not None:
            return {c: gr.skip() for c in self.results()}
        return self.cleared(shown)

    def first_view(self, loaded: LoadedModel, a: session.Analysis, look: Look, shown: tuple, *, uploaded: bool,
                   selected: tuple | None = None) -> dict:  # fmt: skip
        """The first answer to a new image: predictions and the class-attention view, as soon as they are
        computed (with the tile `selected` enlarged); what the other tabs and the downloads need follows in
        `details`."""
        s = self.page.shared
        for note in a.notes:
            gr.Info(note)
        preds = top_predictions(a.probs, loaded.labels)
        out = self.cleared(shown, texts.status_markdown(loaded, preds[0], a.notes, uploaded=uploaded))
        out |= self.tabs.ca.outputs(a, look, selected, shown, sheet=False)
        out |= {s.analysis: a, s.top5: texts.top5_html(preds), self.page.ca.selected: selected}
        for tab in self.tabs.all:
            out |= tab.at_first_view(loaded, a)
        return out

    def analyse_path(self, choice: ModelChoice, path: str | None, look: Look, sa_layer: int, shown: tuple, *,
                     uploaded: bool, selected: tuple[int, int] | None = None) -> dict:  # fmt: skip
        """The image at `path` analysed by the session's model: the first view (with the class-attention tile
        `selected` (layer, 0 for the mean or head + 1) enlarged), or a message."""
        if path is None:
            return self.cleared(shown)
        loaded = self.cache.get(choice)
        start = time.perf_counter()
        try:
            a = session.analyse(loaded, path, sa_layer=within(sa_layer, loaded.cfg.depth, 1) - 1)  # at the door
        except ImageInputError as e:
            log.info("could not analyse an upload: %s", e)
            return self.cleared(shown, f"**Could not analyse this file:** {e}")
        log.info("analysed %s with %s in %.2f s", Path(path).name, loaded.name, time.perf_counter() - start)
        return self.first_view(loaded, a, look, shown, uploaded=uploaded, selected=selected)

    def upload(self, **asked: Any) -> dict:
        """An uploaded file analysed (or refused, in the status line); no example, and no atlas exemplar, is
        highlighted any more. asked: `UploadAsk`'s fields, by name."""
        ask = UploadAsk(**asked)
        path = payload_path(ask.image_in)
        out = self.analyse_path(ask.choice, path, ask.look, ask.th_layer, ask.ca_props, uploaded=True)
        return out | unselected(self.page.shared.examples, self.page.dataset.exemplars)

    def example(self, evt: gr.SelectData, **asked: Any) -> dict:
        """An example clicked: analysed, and shown in the image box; an atlas exemplar opened before is highlighted
        no more. asked: `ImageAsk`'s fields, by name."""
        ask = ImageAsk(**asked)
        path = evt.value["image"]["path"]
        out = self.analyse_path(ask.choice, path, ask.look, ask.th_layer, ask.ca_props, uploaded=False)
        return out | {self.page.shared.image_in: path} | unselected(self.page.dataset.exemplars)

    def details(self, **asked: Any) -> dict:
        """After the first view of an image: the downloads, the residual ratios, the per-head statistics and the
        talking-heads tab, about two forward passes in all (the SA distances take one); what costs more waits for
        its tab (`follow_up`). asked: the fields of `DetailsAsk`, by name."""
        ask = DetailsAsk(**asked)
        a = ask.analysis
        if a is None or a.choice != ask.choice:
            return gr.skip()
        loaded = self.cache.get(ask.choice)
        out = {self.page.shared.json_file: session.numbers_file(loaded, a)}
        for tab in self.tabs.all:
            out |= tab.details(loaded, a, ask)
        return out

    def follow_up(self, choice, a, open_tab, request: gr.Request | None = None, progress=gr.Progress()):
        """After a new image's `details`: what the tab on show computes of it, at once and in an event of its own
        (the Causal tab's view with its progress and Stop, the Mechanisms tab's lens); a tab not on show computes
        its part once opened."""
        tab = self.tabs.by_label.get(open_tab)
        return gr.skip() if tab is None else tab.follow_up(choice, a, request, progress)  # else: emptied (`cleared`)


def compose(first: LoadedModel, cache: ModelCache, places: dataset.AtlasPlaces) -> tuple[gr.Blocks, Page, Tabs]:
    """The page for a session that starts with `first` (each session may then load its own model), and its tabs'
    events (not wired yet). The page shows as many class-attention layers as `first` has, at least
    `class_attention.MIN_CA_LAYERS`."""
    parts = {}
    with gr.Blocks(title="CaiT lens", delete_cache=(FILE_TTL, FILE_TTL)) as demo:
        shared = _inputs(first)
        with gr.Tabs() as shared["tabs"]:
            for label, tab_id, build, _ in TABS:
                with gr.Tab(label, id=tab_id) as tab:
                    parts[tab_id] = build(first, tab)
    page = Page(Shared(**shared), parts)
    return demo, page, Tabs(page, cache, first.choice, places, class_attention.layers_shown(first))


def _inputs(first: LoadedModel) -> dict[str, Any]:
    """The components above the tabs: the image, its examples, the predictions, status and downloads."""
    parts: dict[str, Any] = dict(choice=gr.State(first.choice), analysis=gr.State(None, time_to_live=STATE_TTL))
    parts["open_tab"] = gr.State(CLASS_ATTENTION_TAB)
    parts["header"] = gr.Markdown(texts.header_markdown(first, hub.cached_variants()), elem_id="header")
    with gr.Row():
        with gr.Column(scale=2):
            parts["image_in"] = gr.Image(
                type="filepath", label="Image", sources=["upload", "clipboard"], height=300, elem_id="image_in"
            )
            gr.Markdown(
                f"Any common image format, up to {MAX_UPLOAD_MB} MB (larger files are refused). The model "
                f"sees the central square, resized to its input size.",
                elem_id="upload_note",
            )
            parts["examples"] = gr.Gallery(
                value=first.examples,
                label="Examples (click one)",
                columns=4,
                height="auto",
                allow_preview=False,
                buttons=[],  # no "Download All" of the examples
                elem_id="examples",
            )
        with gr.Column(scale=3):
            parts["top5"] = gr.HTML(elem_id="top5")
            parts["status"] = gr.Markdown(elem_id="status")
            with gr.Row():
                parts["grid_file"] = gr.File(label="Class-attention grid (PNG)", elem_id="grid_png")
                parts["json_file"] = gr.File(label="All numbers (JSON)", elem_id="numbers_json")
    return parts


def _new_image_chain(page: Page, tabs: Tabs) -> tuple[dict, dict, dict]:
    """The events that follow a new image's first view, in order: its details (the other tabs and the downloads),
    the Causal tab's Stop armed, and what the open tab computes."""
    s, ev, on_torch = page.shared, tabs.image, torch_thread.handler  # every handler that computes: app.torch_thread
    detailed = dict.fromkeys(c for tab in tabs.all for c in tab.detailed())
    details = dict(
        fn=on_torch(ev.details),
        inputs_kwargs=named(
            (page.saliency, page.talking), DetailsAsk, **page.look(), choice=s.choice, analysis=s.analysis
        ),
        outputs=[s.json_file, *detailed],
        show_progress="hidden",
        js=AFTER_TILES_SHOWN,
        **MODEL_EVENTS,
        **NO_BOUNDS_CHECK,  # the query and the region's map of the page's model: taken at the door
    )
    # a Stop from now on counts for the new image's view when the Causal tab is on show
    arm = dict(
        fn=tabs.causal.stops.new_image, inputs=[s.open_tab, s.analysis], outputs=page.causal.cz_stop, queue=False,
        api_visibility="private", show_progress="hidden",
    )  # fmt: skip
    in_open_tab = list(dict.fromkeys([*(c for tab in tabs.all for c in tab.followed()), s.json_file]))
    open_tab = dict(  # not on the quick lane: the Causal view runs on the long one (app.torch_thread)
        fn=answering(
            ev.follow_up, said=lambda line: {s.status: line, page.causal.cz_stop: gr.Button(interactive=False)}
        ),
        inputs=[s.choice, s.analysis, s.open_tab],
        outputs=[*in_open_tab, s.status],
        show_progress_on=[page.causal.cz_cost],
        **LONG_EVENTS,
    )
    return details, arm, open_tab


def _wire_image(demo: gr.Blocks, page: Page, tabs: Tabs) -> None:
    """A new image (an upload, an example, an atlas's exemplar): the first view, then the follow-up, then what
    the open tab computes, each an event of its own so that the page is interactive meanwhile."""
    s, ev, on_torch = page.shared, tabs.image, torch_thread.handler  # every handler that computes: app.torch_thread
    # upload (user's file or paste), not change: a programmatic value (an example, a model swap) must not run the
    # analysis a second time. Each event lists as outputs only what it writes, and writes all of them. One
    # progress indicator, on the predictions, not one on each of the ~20 outputs: their overlays kept the browser
    # busy on the cores the analysis runs on.
    asked = named(page.talking, ImageAsk, **page.look(), choice=s.choice, ca_props=page.ca.ca_props)
    progress = dict(show_progress_on=[s.top5], **MODEL_EVENTS)
    upload = s.image_in.upload(
        tabs.model.after_swap(on_torch(ev.upload)),  # asked before the page's ?model= swap landed: its model
        inputs_kwargs=named(
            page.talking, UploadAsk, **page.look(), choice=s.choice, ca_props=page.ca.ca_props, image_in=s.image_in
        ),
        outputs=[*ev.results(), s.examples, page.dataset.exemplars],
        preprocess=False,
        **progress,
    )
    example = s.examples.select(
        tabs.model.after_swap(on_torch(ev.example)), inputs_kwargs=asked,
        outputs=[*ev.results(), s.image_in, page.dataset.exemplars],
        **progress, **NO_BOUNDS_CHECK,  # the talking-heads layer: clamped to the page's model by the analysis
    )  # fmt: skip
    picks = [pick for tab in tabs.all for pick in tab.wire_image_picks(demo, page, ev.results())]
    details, arm, open_tab = _new_image_chain(page, tabs)
    for event in (upload, example, *(event for _, event in picks)):
        event.success(**details).success(**arm).success(**open_tab)
    # at the pick, off the queues: the page's long work of its last image ends before the new one's is asked for
    gr.on(
        [s.image_in.upload, s.examples.select, *(trigger for trigger, _ in picks)], tabs.causal.stops.moved_on,
        None, None, queue=False, api_visibility="private", show_progress="hidden",
    )  # fmt: skip
    s.image_in.change(
        ev.image_changed, [s.image_in, page.ca.ca_props], ev.results(), preprocess=False, queue=False,
        api_visibility="private",
    )  # fmt: skip
    # which tab is open (for the follow-up), at once and off the model queue
    s.tabs.select(tab_opened, None, s.open_tab, queue=False, api_visibility="private")


def wire(demo: gr.Blocks, page: Page, tabs: Tabs, *, cache: ModelCache, default: ModelChoice) -> None:
    """Every event of the page, and /analyze."""
    with demo:
        _wire_image(demo, page, tabs)
        for tab in tabs.all:
            tab.wire(demo, page)
        # off the quick lane: the answer takes each lane for its parts (`Analyze._answer`)
        gr.api(Analyze(cache, default).published(), api_name="analyze", concurrency_id="model")
        gr.api(CompareImage(cache, default).compare, api_name="compare", concurrency_id="model")


def build_app(cache: ModelCache, default: ModelChoice, places: dataset.AtlasPlaces | None = None) -> gr.Blocks:
    """The whole app; a new session starts with `default`; `places`: where the Dataset tab finds atlases."""
    first = torch_thread.call(cache.get, default)
    demo, page, tabs = compose(first, cache, places or dataset.AtlasPlaces.of(None, None))
    wire(demo, page, tabs, cache=cache, default=default)
    demo.queue(default_concurrency_limit=CONCURRENCY, max_size=QUEUE_SIZE)
    guard_api_calls(demo)  # a malformed raw call is refused in one line before Gradio reads it
    return demo


LOCALHOST_PATIENCE_S = 120.0  # how long launching waits for its own server to answer on this machine


@contextmanager
def _patient_localhost_check(seconds: float = LOCALHOST_PATIENCE_S) -> Iterator[None]:
    """Inside, Gradio's check that the server it started answers on localhost is asked again until `seconds` have
    passed. Its own gives up at the first request that takes 3 s and stops the app ("When localhost is not
    accessible..."), which a loaded machine's first requests can take: the app exited at start, or while a page
    loaded."""
    from gradio import networking

    answers = networking.url_ok

    def patient(url: str) -> bool:
        deadline = time.monotonic() + seconds
        while not answers(url):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)  # it refuses at once while the server is not listening yet
        return True

    networking.url_ok = patient
    try:
        yield
    finally:
        networking.url_ok = answers


def launch(
    demo: gr.Blocks, *, host: str = "127.0.0.1", port: int = 7860, block: bool = True, served: tuple[str, ...] = ()
) -> None:
    """Serve `demo`; `served`: folders beyond `served_paths` whose files the page links to (atlas pages)."""
    with _patient_localhost_check():
        _launch(demo, host=host, port=port, served=served)
    print(f"cait-lens app on {demo.local_url} (Ctrl+C to stop)", flush=True)
    if block:
        demo.block_thread()


def _launch(demo: gr.Blocks, *, host: str, port: int, served: tuple[str, ...]) -> None:
    demo.launch(
        server_name=host,
        server_port=port,
        share=False,
        theme=gr.themes.Default(**THEME),
        css=style.CSS,
        js=STAND_IN_JS,  # an over-size or non-image file is refused like a corrupt one (app.images)
        max_file_size=MAX_RECEIVED_MB * 2**20,  # larger than we analyse: see images.MAX_RECEIVED_MB
        ssr_mode=False,
        show_error=True,
        prevent_thread_lock=True,
        allowed_paths=[*served_paths(WORK.path), *served],
        quiet=True,  # Gradio's own banner names a share link we never make; ours is one line
    )
