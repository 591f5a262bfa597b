"""The Compare tab: the page's model (A) against a second one (B, any the Model tab can load, from the same model
cache) on the page's image (both top-5, every CA head of both side by side with their difference, each head's
direct write to the logit, |gamma| and the residual ratios per depth), and a compare run (`cait.compare`: opened
from its folder, or built here over the shipped val scenes with progress and a Stop) with its CKA heatmap, head
matrix and matching, whose disagreement images open as the page's image."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import gradio as gr

import cait.compare
from app import compare_view as cv
from app import dataset_view as dv
from app import torch_thread
from app.long_work import Ended, LongWork, first_line, scenes_done
from app.models import LoadedModel, ModelCache, ModelChoice
from app.page_tab import PageTab
from app.shared import MODEL_EVENTS, NO_BOUNDS_CHECK, ImageAsk, Shared, log, named
from app.stops import ByPage, page_of
from app.workdir import WORK, kept
from cait.errors import InputError

COMPARE_TAB = "Compare"
BUILT = "compare-runs"  # the user cache's folder of the runs built in the app (`app.workdir.kept`)
DEFAULT_SCENES = 100
CMAP, ALPHA = "inferno", 0.5  # how the heads' maps are drawn (each over its own min .. max)


@dataclass
class CompareParts:
    compare_tab: gr.Tab
    cmp_variant: gr.Dropdown
    cmp_checkpoint: gr.Textbox
    cmp_load: gr.Button
    cmp_msg: gr.Markdown
    cmp_top5: gr.HTML
    cmp_heads: gr.Gallery
    cmp_dla: gr.Plot
    cmp_depth: gr.Plot
    cmp_folder: gr.Textbox
    cmp_open: gr.Button
    cmp_scenes: gr.Number
    cmp_build: gr.Button
    cmp_stop: gr.Button
    cmp_run_msg: gr.Markdown
    cmp_cka: gr.Plot
    cmp_matrix: gr.Plot
    cmp_disagree: gr.Gallery

    @property
    def shown(self) -> list:
        """What the image's comparison writes (and a new image, or a new model, empties)."""
        return [self.cmp_top5, self.cmp_heads, self.cmp_dla, self.cmp_depth, self.cmp_msg]

    results = shown

    @property
    def run_shown(self) -> list:
        return [self.cmp_run_msg, self.cmp_cka, self.cmp_matrix, self.cmp_disagree]


@dataclass(frozen=True)
class ChooseAsk:
    """What choosing model B sends, each field named as its component (`app.shared.named`)."""

    choice: ModelChoice
    analysis: Any
    cmp_variant: str | None
    cmp_checkpoint: str | None


@dataclass
class Sides:
    """One page's model B and open compare run."""

    b: ModelChoice | None = None
    run: cait.compare.CompareRun | None = None


def build(first: LoadedModel, tab: gr.Tab) -> CompareParts:
    """The tab's components (inside `tab`)."""
    gr.Markdown(
        "The page's model (A) against a second one (B) on the page's image: both top-5, every class-attention head "
        "of both side by side (paired by an open compare run's matching, else by layer and head) with B − A where "
        "the grids match, each head's direct write to the logit of A's top class, and LayerScale and the residual "
        "stream per depth. A compare run adds what holds over many images."
    )
    parts: dict[str, Any] = {"compare_tab": tab}
    with gr.Row():
        parts["cmp_variant"] = gr.Dropdown(cait.list_models(), value=None, label="Model B", elem_id="cmp_variant")
        parts["cmp_checkpoint"] = gr.Textbox(label="or a checkpoint file of B (path)", elem_id="cmp_checkpoint")
        parts["cmp_load"] = gr.Button("Compare", variant="primary", scale=0, elem_id="cmp_load")
    parts["cmp_msg"] = gr.Markdown(elem_id="cmp_msg")
    parts["cmp_top5"] = gr.HTML(elem_id="cmp_top5")
    parts["cmp_heads"] = gr.Gallery(
        label="CA heads: A | B | B − A", columns=3, height="auto", allow_preview=False, elem_id="cmp_heads"
    )
    with gr.Row():
        parts["cmp_dla"] = gr.Plot(label="Direct write to the logit", elem_id="cmp_dla")
        parts["cmp_depth"] = gr.Plot(label="Per depth", elem_id="cmp_depth")
    gr.Markdown(f"**A compare run** (`python -m cait.compare ... --out OUT`, or built here from the {dv.SCENES_SAID})")
    with gr.Row():
        parts["cmp_folder"] = gr.Textbox(label="Run folder", elem_id="cmp_folder")
        parts["cmp_open"] = gr.Button("Open", scale=0, elem_id="cmp_open")
        parts["cmp_scenes"] = gr.Number(DEFAULT_SCENES, label="Scenes", precision=0, elem_id="cmp_scenes")
        parts["cmp_build"] = gr.Button("Build a run", scale=0, elem_id="cmp_build")
        parts["cmp_stop"] = gr.Button("Stop", scale=0, interactive=False, elem_id="cmp_stop")
    parts["cmp_run_msg"] = gr.Markdown(elem_id="cmp_run_msg")
    with gr.Row():
        parts["cmp_cka"] = gr.Plot(label="CKA", elem_id="cmp_cka")
        parts["cmp_matrix"] = gr.Plot(label="Heads", elem_id="cmp_matrix")
    parts["cmp_disagree"] = gr.Gallery(
        label="Where the two disagree", columns=6, height="auto", allow_preview=False, elem_id="cmp_disagree"
    )
    return CompareParts(**parts)


class CompareTab(PageTab):
    """The tab's events; each page's model B and run are kept here (`Sides`, by page), dropped when it closes."""

    def __init__(self, parts: CompareParts, shared: Shared, cache: ModelCache, *, default: ModelChoice, image: Any):
        self.parts, self.shared, self.cache, self.default, self.image = parts, shared, cache, default, image
        self.stops = LongWork(parts.cmp_stop)  # the page's Stop of its compare run's build
        self.pages = ByPage(Sides)  # each page's model B and run, dropped when it closes

    @classmethod
    def on_page(cls, parts: CompareParts, page: Any) -> CompareTab:
        return cls(parts, page.shared, page.cache, default=page.default, image=page.image)

    def choose(self, request: gr.Request | None = None, **asked: Any) -> dict:
        """Model B chosen (loaded into the page's model cache; a calm line when it does not load), then the
        page's image compared. asked: `ChooseAsk`'s fields, by name."""
        ask = ChooseAsk(**asked)
        choice, a, checkpoint = ask.choice, ask.analysis, (ask.cmp_checkpoint or "").strip() or None
        wanted = ModelChoice(ask.cmp_variant or None, checkpoint, random_init=self.default.random_init)
        if wanted.name is None and wanted.checkpoint is None:
            return {self.parts.cmp_msg: "**Choose model B:** a variant, or a checkpoint file."}
        try:
            other = self.cache.get(wanted)
        except (InputError, OSError) as e:  # a user's choice, or a file that failed
            log.info("could not load model B %s: %s", wanted, first_line(e))
            return {self.parts.cmp_msg: f"**Could not load model B:** {first_line(e)}"}
        self.pages.of(page_of(request)).b = wanted
        shown = self.view(choice, a, request) or {}
        return shown | {
            self.parts.cmp_msg: f"Model B: **{other.name}** ({other.source}). {shown.get(self.parts.cmp_msg, '')}"
        }

    def view(self, choice, a, request: gr.Request | None = None) -> dict | None:
        """The page's image through A and B (None: no image, or no model B yet)."""
        sides = self.pages.of(page_of(request))
        if a is None or a.choice != choice or sides.b is None or a.source is None:
            return None
        loaded, other = self.cache.get(choice), self.cache.get(sides.b)
        try:
            seen, view_b = cv.compared(loaded, a.x, a.source, other, sides.run, seen_a=cv.seen_of(a))
        except InputError as e:
            return self.cleared(()) | {self.parts.cmp_msg: f"**Cannot compare:** {first_line(e)}"}
        p, target = self.parts, loaded.labels[seen.target]
        paired = "by the open run's matching" if sides.run else "by layer and head"
        return {
            p.cmp_top5: cv.top5_html(seen, loaded.labels, (f"A: {loaded.name}", f"B: {other.name}")),
            p.cmp_heads: cv.head_tiles(seen, a.view, view_b, WORK.request_dir(), cmap=CMAP, alpha=ALPHA),
            p.cmp_dla: cv.dla_figure(seen, target),
            p.cmp_depth: cv.depth_figure(seen),
            p.cmp_msg: f"**{loaded.name}** (A) against **{other.name}** (B), heads paired {paired}.",
        }

    def opened(self, choice, a, request: gr.Request | None = None) -> Any:
        return self.view(choice, a, request) or gr.skip()

    def open_run(self, folder, choice, a, request: gr.Request | None = None) -> dict:
        """The compare run in `folder`: its CKA, head matrix and disagreements; the image's heads re-paired."""
        p = self.parts
        try:
            run = cait.compare.read_run((folder or "").strip() or ".")
        except InputError as e:
            return {p.cmp_run_msg: f"**Not a compare run:** {first_line(e)}"}
        self.pages.of(page_of(request)).run = run
        loaded = self.cache.get(choice)
        try:
            tiles, said = cv.disagreement_tiles(run, loaded.cfg, WORK.request_dir())
        except InputError as e:  # the run's data is not readable here
            tiles, said = [], f"{len(run.disagreements):,} images answered differently ({first_line(e)})"
        out = {
            p.cmp_run_msg: f"Compare run `{run.folder.name}`: {said}.",
            **dict(zip((p.cmp_cka, p.cmp_matrix), cv.run_figures(run))),
            p.cmp_disagree: tiles,
        }
        return out | (self.view(choice, a, request) or {})

    def build_run(self, choice, scenes, a=None, request: gr.Request | None = None, progress=gr.Progress()) -> dict:
        """A compare run of the page's model against model B over `scenes` val scenes (`cait.compare.run_compare`),
        kept in the user cache, on the long lane; the page's Stop ends it before its next batch (the shards
        written are kept: building it again continues), then opened."""
        with self.stops.holding(request) as held:
            b, n = self.pages.of(page_of(request)).b, int(scenes or 0)
            if b is None:
                return {self.parts.cmp_run_msg: "**Choose model B first** (above)."}
            if not 1 <= n <= dv.MAX_SCENES:
                return {self.parts.cmp_run_msg: f"**Choose 1 to {dv.MAX_SCENES:,} scenes** (got {n})."}
            out = kept(BUILT) / re.sub(r"[^\w.-]+", "_", f"{choice}-vs-{b}-{n}")
            options = cait.compare.CompareOptions(
                a=_side(choice), b=_side(b), data=dv.SCENES, out=out, limit=n, batch_size=16, shard_size=32,
                device=self.cache.get(choice).device.type,
            )  # fmt: skip
            report = lambda done, total: progress((done, total), desc="comparing", unit="images")  # noqa: E731
            models = (self.cache.get(choice).sourced, self.cache.get(b).sourced)  # the page's copies, not new ones
            work = lambda: cait.compare.run_compare(  # noqa: E731
                options, progress=report, should_stop=held.pressed, models=models
            )
            from cait.compare.run import CompareStopped  # torch-heavy: only once a run is built

            ended = self.stops.run(
                work, held=held, what="compare run", stopped=lambda: scenes_done(out, n, "build it again"),
                of_image=False, refused="Could not build the run", stopped_by=(CompareStopped,),
            )  # fmt: skip
        if isinstance(ended, Ended):
            return {self.parts.cmp_run_msg: ended.line}
        return torch_thread.call(self.open_run, str(out), choice, a, request)

    def pick(self, evt: gr.SelectData, **asked: Any) -> dict:
        """A disagreement image clicked: the page's image. asked: `ImageAsk`'s fields, by name."""
        ask, path = ImageAsk(**asked), evt.value["image"]["path"]
        out = self.image.analyse_path(ask.choice, path, ask.look, ask.th_layer, ask.ca_props, uploaded=False)
        return out | {self.shared.image_in: path}

    def followed(self) -> list:
        return self.parts.shown

    def follow_up(self, choice, a, request, progress) -> Any:
        return torch_thread.handler(self.opened)(choice, a, request)

    def wire_image_picks(self, demo: gr.Blocks, page: Any, outputs: list) -> list:
        s = self.shared
        asked = named(page.talking, ImageAsk, **page.look(), choice=s.choice, ca_props=page.ca.ca_props)
        event = self.parts.cmp_disagree.select(
            torch_thread.handler(self.pick), inputs_kwargs=asked, outputs=[*outputs, s.image_in],
            show_progress_on=[s.top5], **MODEL_EVENTS, **NO_BOUNDS_CHECK,
        )  # fmt: skip
        return [(self.parts.cmp_disagree.select, event)]

    def wire(self, demo: gr.Blocks, page: Any) -> None:
        p, s, on_torch = self.parts, self.shared, torch_thread.handler
        demo.unload(self.pages.drop)
        image = [s.choice, s.analysis]
        p.compare_tab.select(on_torch(self.opened), image, p.shown, **MODEL_EVENTS)
        asked = named(p, ChooseAsk, choice=s.choice, analysis=s.analysis)
        p.cmp_load.click(
            on_torch(self.choose), inputs_kwargs=asked, outputs=p.shown, show_progress_on=[p.cmp_msg], **MODEL_EVENTS
        )
        opened = [*p.run_shown, *p.shown]
        p.cmp_open.click(on_torch(self.open_run), [p.cmp_folder, *image], opened, **MODEL_EVENTS)
        self.stops.wire(
            demo, p.cmp_build.click, self.build_run, hidden=True, inputs=[s.choice, p.cmp_scenes, s.analysis],
            outputs=opened, show_progress_on=[p.cmp_run_msg],
        )  # fmt: skip


def _side(choice: ModelChoice) -> cait.compare.Side:
    return cait.compare.Side(model=choice.name, checkpoint=choice.checkpoint, random_init=choice.random_init)
