"""The Dataset tab: a head atlas (`python -m cait.atlas`) opened, per CA head its numbers and exemplars (filtered by
class and by right or wrong), an atlas of the shipped val scenes built here for the page's model (the model from
the app's cache: one copy in memory; kept in the user cache, stopped and continued like the command line's, and
downloaded as a zip), and an exemplar opened in the single-image tabs with its head enlarged. `app.dataset_view`
reads the atlas."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import gradio as gr

from app import dataset_view as dv
from app import torch_thread
from app.long_work import Ended, LongWork, scenes_done
from app.models import LoadedModel, ModelCache, ModelChoice
from app.page_tab import PageTab
from app.shared import CLASS_ATTENTION_TAB, MODEL_EVENTS, NO_BOUNDS_CHECK, ImageAsk, Shared, log, named
from app.workdir import WORK, kept
from cait.atlas.options import AtlasOptions
from cait.config import CaiTConfig
from cait.data import DataError
from cait.data.image_file import IMAGE_ERRORS
from cait.figures import head_name

BUILT = "atlases"  # the user cache's folder of the atlases built in the app (`app.workdir.kept`)


@dataclass(frozen=True)
class AtlasPlaces:
    """Where the server finds atlases: one to open on every new page (--atlas), a folder to offer (--atlas-dir)."""

    opened: str | None = None
    folder: str | None = None

    @classmethod
    def of(cls, atlas: str | None, folder: str | None) -> "AtlasPlaces":
        """--atlas-dir defaults to the folder of --atlas, else out/."""
        return cls(atlas, folder or (str(Path(atlas).parent) if atlas else "out"))

    def served(self) -> list[str]:
        """Folders whose atlas.html pages the app links to (Gradio's allowed_paths)."""
        return [str(Path(p).resolve()) for p in (self.opened, self.folder) if p]


@dataclass
class DatasetParts:
    """The tab's components, named for its events."""

    atlas: gr.State  # the open Atlas (or None)
    pick: gr.Dropdown
    msg: gr.Markdown  # what went wrong, or that the atlas's model is not the page's
    overview: gr.Markdown
    heatmap: gr.Plot
    heads_split: gr.Dataframe  # every head over the right and the wrong predictions apart; a row opens its head
    download: gr.DownloadButton  # the open atlas's files as a zip
    head: gr.Dropdown
    numbers: gr.Dataframe
    per_class: gr.Dataframe
    of_class: gr.Dropdown  # the exemplars' class filter
    outcome: gr.Radio  # the exemplars' filter on right and wrong predictions
    exemplars: gr.Gallery
    scenes: gr.Slider
    build: gr.Button
    stop: gr.Button  # enabled only while this page builds an atlas

    @property
    def opened(self) -> list:
        """What opening an atlas writes."""
        return [
            *(self.atlas, self.pick, self.msg, self.overview, self.heatmap, self.heads_split, self.download),
            *self.head_shown,
        ]

    @property
    def head_shown(self) -> list:
        """What picking a head writes."""
        return [self.head, self.of_class, self.outcome, self.numbers, self.per_class, self.exemplars]


@dataclass(frozen=True)
class ExemplarAsk(ImageAsk):
    """What a click on an exemplar sends (by name): `ImageAsk`'s fields and the atlas's head."""

    atlas: dv.Atlas | None = None
    head: int | None = None
    of_class: str | None = None
    outcome: str = dv.OUTCOMES[0]


def scenes_options(choice: ModelChoice, scenes: int, out: Path, device: str) -> AtlasOptions:
    """The atlas of the first `scenes` test scenes for the page's model, into `out` (the command line's defaults
    for everything else; no loader processes inside the server)."""
    return AtlasOptions(
        out=out,
        data=dv.SCENES,
        limit=scenes,
        workers=0,
        device=device,
        shard_size=dv.BUILT_SHARD,
        model=choice.name or None,
        checkpoint=choice.checkpoint or None,
        pretrained=bool(choice.download),
        random_init=bool(choice.random_init),
    )


def build(first: LoadedModel, tab: gr.Tab) -> DatasetParts:
    """The tab's components (inside its gr.Tab); empty until an atlas is opened."""
    gr.Markdown(
        f"A head atlas over a dataset (`python -m cait.atlas ... --out OUT`, or built here from the {dv.SCENES_SAID}): "
        "per class-attention head its numbers over the images and its exemplars. Click an exemplar "
        "to open it in the single-image tabs with that head enlarged."
    )
    parts: dict[str, Any] = {"atlas": gr.State(None)}
    with gr.Row():
        parts["pick"] = gr.Dropdown(choices=[], label="Atlas", allow_custom_value=True, scale=3, elem_id="ds_pick")
        parts["download"] = gr.DownloadButton("Download the atlas (zip)", value=None, scale=1, elem_id="ds_download")
    with gr.Row():
        parts["scenes"] = gr.Slider(
            1, dv.MAX_SCENES, value=dv.DEFAULT_SCENES, step=1, label="Val scenes", scale=2, elem_id="ds_scenes"
        )
        parts["build"] = gr.Button("Build an atlas of them for this page's model", scale=1, elem_id="ds_build")
        parts["stop"] = gr.Button("Stop", size="sm", scale=0, min_width=80, interactive=False, elem_id="ds_stop")
    gr.Markdown(
        f"Atlases built here are kept in `{kept(BUILT)}`; a stopped build continues when built again.",
        elem_id="ds_where",
    )
    parts["msg"] = gr.Markdown(elem_id="ds_msg")
    parts["overview"] = gr.Markdown(min_height=80, elem_id="ds_overview")  # room for the build's progress bar
    with gr.Row():
        parts["head"] = gr.Dropdown(choices=[], label="Head", elem_id="ds_head")
        parts["of_class"] = gr.Dropdown(choices=[], label="Exemplars of the class", elem_id="ds_of_class")
        parts["outcome"] = gr.Radio(
            list(dv.OUTCOMES), value=dv.OUTCOMES[0], label="Exemplars of predictions", elem_id="ds_outcome"
        )
    with gr.Row():
        parts["numbers"] = gr.Dataframe(
            headers=dv.NUMBER_HEADERS, label="The head over the data", interactive=False, elem_id="ds_numbers"
        )
        parts["per_class"] = gr.Dataframe(
            headers=dv.CLASS_HEADERS, label="Its mean DLA by predicted class", interactive=False, elem_id="ds_per_class"
        )
    parts["exemplars"] = gr.Gallery(
        label="Exemplars (click one to open it)",
        columns=6,
        allow_preview=False,
        height="auto",
        elem_id="ds_exemplars",
        elem_classes=["no-scroll"],
    )
    parts["heads_split"] = gr.Dataframe(
        label="Every head over the right and the wrong predictions (click a row to open its head)",
        interactive=False,
        elem_id="ds_heads_split",
    )
    parts["heatmap"] = gr.Plot(label="Mean DLA, heads x predicted classes", elem_id="ds_heatmap")
    return DatasetParts(**parts)


def model_note(atlas: dv.Atlas, loaded: LoadedModel) -> str:
    """What the tab says when the atlas was made with another model than the page's (else nothing)."""
    if atlas.made_by(loaded.sourced.made_from):
        return ""
    return (
        f"This atlas was made with another model than this page's ({loaded.choice}): an exemplar opens with the "
        f"page's model. Load the atlas's model in the Model tab to see its heads."
    )


def exemplar_file(atlas: dv.Atlas, exemplar: dv.Exemplar, cfg: CaiTConfig) -> str:
    """The exemplar as a PNG file in the work folder (built-in scenes have no file of their own), read for a model
    of config `cfg`."""
    images, index = dv.atlas_images(atlas, cfg)
    image = images.image(index[exemplar.path])
    path = WORK.request_dir() / f"{Path(exemplar.path).stem}.png"
    image.save(path)
    return str(path)


class DatasetTab(PageTab):
    """The tab's events. analyse(choice, path, look, sa_layer, shown, uploaded=, selected=): the page's first view
    of an image (`app.ui` composes it), for an exemplar opened."""

    def __init__(
        self, parts: DatasetParts, shared: Shared, cache: ModelCache, places: AtlasPlaces, analyse: Callable[..., dict]
    ):
        self.parts, self.shared, self.cache, self.places, self.analyse = parts, shared, cache, places, analyse
        self.stops = LongWork(parts.stop)  # the page's Stop of its atlas build
        self.builder = AtlasBuilder(parts, cache, self.stops, self.open)

    kept_on_new_model = True  # an open atlas stays open

    @classmethod
    def on_page(cls, parts: DatasetParts, page: Any) -> DatasetTab:
        return cls(parts, page.shared, page.cache, page.places, analyse=page.image.analyse_path)

    def choices(self) -> list[tuple[str, str]]:
        """The atlases to offer: --atlas, those under --atlas-dir, those built here (label, folder)."""
        built = dv.find_atlases(kept(BUILT))
        found = [Path(self.places.opened)] if self.places.opened else []
        found += [p for p in dv.find_atlases(self.places.folder) if p not in found]
        return [(p.name, str(p)) for p in found] + [(f"built here: {p.name}", str(p)) for p in built]

    def start(self, choice: ModelChoice) -> dict:
        """A new page: the --atlas opened, or the atlases on offer."""
        if self.places.opened:
            return self.open(self.places.opened, choice)
        return {self.parts.pick: gr.Dropdown(choices=self.choices(), value=None)}

    def open(self, folder: str | None, choice: ModelChoice) -> dict:
        """The atlas in `folder`: its overview, heatmap and first head; a folder that is not one is a message."""
        t = self.parts
        out = dict.fromkeys(t.opened) | self._filters(None)
        out[t.pick] = gr.Dropdown(choices=self.choices(), value=folder, allow_custom_value=True)
        out[t.download] = gr.DownloadButton(value=None, interactive=False)
        if not folder:
            return out | {t.msg: "", t.head: gr.Dropdown(choices=[], value=None)}
        try:
            atlas = dv.read_atlas(folder)
        except dv.NotAnAtlas as e:
            log.info("could not open an atlas: %s", e)
            return out | {t.msg: f"**Cannot open this atlas:** {e}", t.head: gr.Dropdown(choices=[], value=None)}
        out.update({t.atlas: atlas, t.overview: dv.overview_markdown(atlas), t.heatmap: dv.heatmap(atlas)})
        headers, split = dv.heads_split(atlas)
        out[t.heads_split] = gr.Dataframe(value=split or None, headers=headers or None, visible=bool(split))
        out[t.download] = gr.DownloadButton(value=str(dv.zip_atlas(atlas, WORK.request_dir())), interactive=True)
        out[t.msg] = model_note(atlas, self.cache.get(choice))
        if not atlas.heads:
            return out | {t.msg: "**This atlas holds no readable image.**", t.head: gr.Dropdown(choices=[])}
        out[t.head] = gr.Dropdown(choices=atlas.head_choices(), value=0)
        return out | self._filters(atlas) | self.show_head(atlas, 0, choice)

    def _filters(self, atlas: dv.Atlas | None) -> dict:
        """The exemplar filters of a newly opened atlas: every class and every prediction (none without
        images.csv)."""
        classes = [] if atlas is None else atlas.filter_classes()
        choices = [dv.ALL_CLASSES, *classes] if classes else []
        return {
            self.parts.of_class: gr.Dropdown(choices=choices, value=dv.ALL_CLASSES if classes else None),
            self.parts.outcome: gr.Radio(value=dv.OUTCOMES[0], interactive=bool(classes)),
        }

    def show_head(
        self,
        atlas: dv.Atlas | None,
        head: int | None,
        choice: ModelChoice,
        of_class: str | None = None,
        outcome: str = dv.OUTCOMES[0],
    ) -> dict:
        """Head number `head`'s numbers, its mean DLA per class and its exemplars (the images as the atlas read
        them), of the class `of_class` (None or ALL_CLASSES: every class) and the predictions `outcome`
        (dv.OUTCOMES)."""
        t = self.parts
        if atlas is None or head is None:
            return {t.numbers: None, t.per_class: None, t.exemplars: None}
        k, cls = int(head), None if of_class in (None, dv.ALL_CLASSES) else of_class
        exemplars = atlas.exemplars(k, cls, outcome or dv.OUTCOMES[0])
        tiles, missing = self._tiles(atlas, exemplars, choice)
        if not exemplars:
            missing = "**No image of the atlas passes this filter.**"
        out = {
            t.numbers: dv.head_numbers(atlas, k),
            t.per_class: dv.class_numbers(atlas, k),
            t.exemplars: gr.update(value=tiles or None, columns=atlas.columns()),
        }
        return out | ({t.msg: missing} if missing else {})

    def head_of_row(self, evt: gr.SelectData, **picked: Any) -> dict:
        """A row of the heads' table clicked: that head picked and shown (with the exemplar filters as they are).
        picked: `show_head`'s arguments but the head, by name."""
        head = int(evt.index[0]) if evt.index is not None else None
        return {self.parts.head: head} | self.show_head(head=head, **picked)

    def _tiles(self, atlas: dv.Atlas, exemplars: list[dv.Exemplar], choice: ModelChoice) -> tuple[list, str]:
        """(image file, caption) per exemplar that can be read, and a message naming those that cannot."""
        folder, tiles, failed = WORK.request_dir(), [], []
        try:
            images, index = dv.atlas_images(atlas, self.cache.get(choice).cfg)
        except (DataError, dv.NotAnAtlas) as e:
            return [], f"**The atlas's images cannot be read here:** {e}"
        for j, e in enumerate(exemplars):
            try:
                image = images.image(index[e.path])
            except (KeyError, *IMAGE_ERRORS):
                failed.append(e.path)
                continue
            image.save(folder / f"exemplar_{j}.png")
            tiles.append((str(folder / f"exemplar_{j}.png"), e.caption))
        missing = f"**Missing or unreadable in the atlas's data:** {', '.join(failed)}" if failed else ""
        return tiles, missing

    def open_exemplar(self, evt: gr.SelectData, **asked: Any) -> dict:
        """A click on an exemplar: that image analysed in the single-image tabs by the page's model, with the
        head enlarged in the Class attention tab (when the page's model has it), and that tab shown.
        asked: `ExemplarAsk`'s fields, by name."""
        ask, s, t = ExemplarAsk(**asked), self.shared, self.parts
        atlas, k, choice = ask.atlas, ask.head, ask.choice
        if atlas is None or k is None:
            return {t.msg: "**Open an atlas first.**"}
        cls = None if ask.of_class in (None, dv.ALL_CLASSES) else ask.of_class
        exemplar = atlas.exemplars(int(k), cls, ask.outcome or dv.OUTCOMES[0])[int(evt.index)]
        try:
            path = exemplar_file(atlas, exemplar, self.cache.get(choice).cfg)
        except (DataError, dv.NotAnAtlas, KeyError, *IMAGE_ERRORS) as e:
            problem = f"{exemplar.path} is no longer in the atlas's data" if isinstance(e, KeyError) else str(e)
            log.info("could not open an exemplar: %s", problem)
            return {t.msg: f"**Cannot open this exemplar:** {problem}"}
        entry = atlas.heads[int(k)]
        loaded = self.cache.get(choice)
        head = (entry["layer"] - 1, entry["head"] - 1)
        fits = head[0] < loaded.cfg.depth_token_only and head[1] < loaded.cfg.num_heads
        same = atlas.made_by(loaded.sourced.made_from)
        selected = (head[0], head[1] + 1) if fits and same else None  # the enlarged tile: 0 is the head mean
        out = self.analyse(choice, path, ask.look, ask.th_layer, ask.ca_props, uploaded=False, selected=selected)
        out[s.image_in] = path
        out[s.examples] = gr.Gallery(selected_index=None)  # one selection frame on the page: the exemplar's
        out[s.tabs] = gr.Tabs(selected="ca")
        out[s.open_tab] = CLASS_ATTENTION_TAB
        out[t.msg] = model_note(atlas, loaded)
        if out.get(s.analysis) is not None:
            name = head_name(head[0], head[1])
            out[s.status] += (
                f"  \nFrom the atlas {atlas.folder.name}: {exemplar.kind} exemplar of {name}, {exemplar.path}."
            )
        return out

    def wire_image_picks(self, demo: gr.Blocks, page: Any, outputs: list) -> list:
        """The tab's events; an exemplar opens with the other tabs' controls (the page's look, talking-heads layer
        and class-attention props), writing `outputs` (the page's first view of an image) and this tab's message."""
        t, s = self.parts, self.shared
        on_torch = torch_thread.handler  # the page's model may have to be loaded (its config reads the atlas's data)
        demo.load(on_torch(self.start), s.choice, t.opened, **MODEL_EVENTS)
        t.pick.input(on_torch(self.open), [t.pick, s.choice], t.opened, **MODEL_EVENTS)
        head_shown = [t.numbers, t.per_class, t.exemplars, t.msg]
        picked = dict(atlas=t.atlas, head=t.head, choice=s.choice, of_class=t.of_class, outcome=t.outcome)
        for control in (t.head, t.of_class, t.outcome):
            control.input(on_torch(self.show_head), inputs_kwargs=picked, outputs=head_shown, **MODEL_EVENTS)
        by_row = {k: v for k, v in picked.items() if k != "head"}
        t.heads_split.select(
            on_torch(self.head_of_row), inputs_kwargs=by_row, outputs=[t.head, *head_shown], **MODEL_EVENTS
        )
        # Build: armed and the Stop enabled at once, off the queues, the build on the long lane's queue
        self.stops.wire(demo, t.build.click, self.builder.build_atlas, inputs=[s.choice, t.scenes], outputs=t.opened,
                        show_progress_on=[t.overview])  # fmt: skip
        asked = named(t, ExemplarAsk, choice=s.choice, ca_props=page.ca.ca_props, th_layer=page.talking.th_layer,
                      **page.look())  # fmt: skip
        event = t.exemplars.select(
            on_torch(self.open_exemplar),
            inputs_kwargs=asked,
            outputs=[*outputs, s.image_in, s.examples, s.tabs, s.open_tab, t.msg],
            show_progress_on=[s.top5],
            **MODEL_EVENTS,
            **NO_BOUNDS_CHECK,  # the talking-heads layer: clamped to the page's model by the analysis
        )
        return [(t.exemplars.select, event)]


class AtlasBuilder:
    """An atlas of the shipped val scenes built for the page's model, with the page's Stop (`stops`), then opened
    (`open(folder, choice)`: the tab's)."""

    def __init__(self, parts: DatasetParts, cache: ModelCache, stops: LongWork, open: Callable[..., dict]):
        self.parts, self.cache, self.stops, self.open = parts, cache, stops, open

    def build_atlas(self, choice: ModelChoice, scenes: float, request: gr.Request | None = None,
                    progress=gr.Progress(track_tqdm=True)) -> dict:  # fmt: skip
        """An atlas of `scenes` val scenes for the page's model (`cait.atlas.run.make`, in this process: its
        progress bar is the page's; the model is the cache's, never a second copy), kept in the user cache
        (`dv.built_folder`), then opened. It runs on the long lane (`torch_thread.call_long`), giving way to the
        pages' quick views at every block. The page's Stop (armed by the button) ends it while it reads
        its scenes (`torch_thread.stoppable`) or before the next block the model runs: the shards written are kept,
        and building the same atlas again continues from them, as the command line does."""
        from cait.atlas.run import make, read_data  # torch-heavy: only once an atlas is built

        with self.stops.holding(request) as held:
            n = int(scenes or 0)
            if not 1 <= n <= dv.MAX_SCENES:
                return {self.parts.msg: f"**Choose 1 to {dv.MAX_SCENES:,} scenes** (got {n})."}
            loaded = torch_thread.call(self.cache.get, choice)
            out = dv.built_folder(kept(BUILT), loaded.name, loaded.sourced.made_from, n)
            progress(0, desc=f"atlas of {n} {dv.SPLIT} scenes: reading the scenes")
            options = scenes_options(choice, n, out, loaded.device.type)

            def work() -> None:
                data = torch_thread.stoppable(lambda: read_data(options, loaded.cfg))
                make(options, loaded.sourced, data, device=loaded.device)

            stopped = lambda: scenes_done(out, n, "build the same number of scenes again")  # noqa: E731
            # the atlas's and the reader's one-line errors, a full disk: the build's line
            ended = self.stops.run(work, held=held, what="atlas build", stopped=stopped, model=loaded.model,
                                   of_image=False, refused="Could not build the atlas")  # fmt: skip
        if isinstance(ended, Ended):
            return {self.parts.msg: ended.line}
        return torch_thread.call(self.open, str(out), choice)
