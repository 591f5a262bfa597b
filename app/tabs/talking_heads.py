"""The Talking heads tab: where one query patch looks in a self-attention layer, per head, at each stage of the
talking-heads computation, the patch picker, and the two mixing matrices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

import cait
from app import figures, session, torch_thread
from app.models import LoadedModel, ModelCache, ModelChoice
from app.page_tab import PageTab
from app.shared import MODEL_EVENTS, NO_BOUNDS_CHECK, Shared, answering, named, within
from app.workdir import WORK
from cait.explain.attention import mixing_matrices


def middle(grid: int) -> int:
    """The query patch's row and column (from 1) a new page, or a new model, starts with."""
    return grid // 2 + 1


def clamped(drawn: dict[gr.Slider, tuple[Any, int, int]]) -> dict:
    """The sliders whose value as the page sent it differs from the one drawn (slider -> (sent, drawn, the model's
    maximum)): each set to the one drawn, within the model's bounds."""
    out = {}
    for slider, (sent, used, high) in drawn.items():
        try:
            same = float(sent) == used
        except (TypeError, ValueError):
            same = False
        if not same:
            out[slider] = gr.Slider(minimum=1, maximum=high, value=used)
    return out


def talking_columns(cfg: cait.CaiTConfig) -> int:
    """Tiles per row of the talking-heads gallery: one per head, at most 8 (16 heads: two rows per stage)."""
    return min(cfg.num_heads, 8)


@dataclass
class TalkingHeadsParts:
    th_layer: gr.Slider
    th_row: gr.Slider
    th_col: gr.Slider
    th_pick: gr.Image
    th_gallery: gr.Gallery
    th_plot: gr.Plot

    @property
    def results(self) -> list:
        """What a new image (or a new model) empties here."""
        return [self.th_gallery, self.th_plot, self.th_pick]

    @property
    def query(self) -> list:
        """The query's sliders, whose bounds follow the page's model: a drawing sets those it had to clamp."""
        return [self.th_layer, self.th_row, self.th_col]


@dataclass(frozen=True)
class QueryAsk:
    """What a slider of the query sends (by name)."""

    choice: ModelChoice
    analysis: session.Analysis | None
    th_layer: int
    th_row: int
    th_col: int


def build(first: LoadedModel, tab: gr.Tab) -> TalkingHeadsParts:
    """The tab's components (inside its gr.Tab)."""
    gr.Markdown(
        "Where one query patch (outlined) looks in a self-attention layer, per head, at each stage of the "
        "talking-heads computation: the raw per-head softmax(QK^T), which the model never computes; after "
        "proj_l mixes the logits across heads and the softmax; after proj_w mixes the weights (what "
        "multiplies the values). Below, the two mixing matrices."
    )
    g = first.cfg.grid_size
    with gr.Row():  # their bounds follow the page's model: a value sent for the last one is clamped at the door
        th_layer = gr.Slider(1, first.cfg.depth, value=1, step=1, label="SA layer", elem_id="th_layer")
        th_row = gr.Slider(1, g, value=middle(g), step=1, label="Query patch row", elem_id="th_row")
        th_col = gr.Slider(1, g, value=middle(g), step=1, label="Query patch column", elem_id="th_col")
    th_pick = gr.Image(
        label="Click a patch to make it the query",
        type="pil",
        interactive=False,
        height=figures.PICKER_SIDE,
        elem_id="th_pick",
        buttons=[],
    )
    th_gallery = gr.Gallery(
        label="Attention of the query patch",
        columns=talking_columns(first.cfg),
        allow_preview=False,
        height="auto",
        elem_id="th_gallery",
        elem_classes=["no-scroll"],
    )
    th_plot = gr.Plot(label="Mixing matrices", elem_id="th_plot")
    return TalkingHeadsParts(th_layer, th_row, th_col, th_pick, th_gallery, th_plot)


class TalkingHeadsTab(PageTab):
    """The tab's events and what it draws."""

    def __init__(self, parts: TalkingHeadsParts, shared: Shared, cache: ModelCache):
        self.parts, self.shared, self.cache = parts, shared, cache

    def outputs(self, loaded: LoadedModel, a: session.Analysis, row: Any, col: Any, layer: Any = None) -> dict:
        """The tab for query patch (`row`, `col`, from 1) of the analysis' SA layer, the sliders' values as the
        page sent them (`layer`: the layer's, when known), taken within the model's bounds at the door; the
        sliders whose value that changed are set to what is drawn (`clamped`)."""
        g = loaded.cfg.grid_size
        row_i, col_i = within(row, g, middle(g)), within(col, g, middle(g))
        patch = (row_i - 1) * g + col_i - 1
        st = a.stages
        tiles = figures.query_tiles(
            a.view, {"raw": st.raw, "after_proj_l": st.after_proj_l, "after_proj_w": st.after_proj_w}, patch
        )
        proj_l, proj_w = (m.float().cpu().numpy() for m in mixing_matrices(loaded.model, st.layer))
        files = figures.save_tiles([image for image, _ in tiles], WORK.request_dir(), "query")
        p = self.parts
        drawn = {p.th_row: (row, row_i, g), p.th_col: (col, col_i, g)}
        if layer is not None:
            drawn[p.th_layer] = (layer, st.layer + 1, loaded.cfg.depth)
        # a value only: the columns follow the model (`for_model`)
        return {
            p.th_gallery: [(f, caption) for f, (_, caption) in zip(files, tiles)],
            p.th_plot: figures.mixing_figure(proj_l, proj_w, st.layer),
            p.th_pick: figures.image_file(figures.query_picker(a.view, g, patch), "query"),
            **clamped(drawn),
        }

    def query(self, **asked: Any) -> dict:
        """Another SA layer or query patch (each slider's value clamped to the page's model at the door). asked:
        the fields of `QueryAsk`, by name."""
        ask = QueryAsk(**asked)
        a = ask.analysis
        if a is None or a.choice != ask.choice:
            return gr.skip()
        loaded = self.cache.get(ask.choice)
        a = session.with_sa_layer(loaded, a, within(ask.th_layer, loaded.cfg.depth, 1) - 1)
        return {self.shared.analysis: a, **self.outputs(loaded, a, ask.th_row, ask.th_col, ask.th_layer)}

    def pick(self, choice, a, layer, evt: gr.SelectData) -> dict:
        """A click on the patch-grid image: that patch becomes the query (the sliders follow)."""
        if a is None or a.choice != choice:
            return gr.skip()
        g = self.cache.get(choice).cfg.grid_size
        x, y = evt.index  # pixels of the picker image
        row, col = (min(int(v * g / figures.PICKER_SIDE), g - 1) + 1 for v in (y, x))
        out = self.query(choice=choice, analysis=a, th_layer=layer, th_row=row, th_col=col)
        return {self.parts.th_row: row, self.parts.th_col: col, **out}

    def detailed(self) -> list:
        return [self.parts.th_gallery, self.parts.th_plot, self.parts.th_pick, *self.parts.query]

    def details(self, loaded: LoadedModel, a: session.Analysis, ask: Any) -> dict:
        return self.outputs(loaded, a, ask.th_row, ask.th_col, ask.th_layer)

    def for_model(self, loaded: LoadedModel) -> dict:
        p, cfg, g = self.parts, loaded.cfg, loaded.cfg.grid_size
        return {
            p.th_layer: gr.Slider(maximum=cfg.depth, value=1),
            p.th_row: gr.Slider(maximum=g, value=middle(g)),
            p.th_col: gr.Slider(maximum=g, value=middle(g)),
            p.th_gallery: gr.Gallery(value=None, columns=talking_columns(cfg)),
        }

    def wire(self, demo: gr.Blocks, page: Any) -> None:
        p, shared, on_torch = self.parts, self.shared, torch_thread.handler
        shown = [shared.analysis, p.th_gallery, p.th_plot, p.th_pick, *p.query]
        # input, not release: arrow keys and a typed value + Enter redraw too (a drag's steps: only the latest);
        # not change, which a programmatic value (a click on the patch grid, a new model) would also fire
        for slider in (p.th_layer, p.th_row, p.th_col):
            slider.input(
                on_torch(answering(self.query)),
                inputs_kwargs=named(p, QueryAsk, choice=shared.choice, analysis=shared.analysis),
                outputs=shown,
                trigger_mode="always_last",
                **MODEL_EVENTS,
                **NO_BOUNDS_CHECK,  # the handler takes the sliders within the page's model
            )
        p.th_pick.select(
            on_torch(answering(self.pick)),
            [shared.choice, shared.analysis, p.th_layer],
            shown,
            **MODEL_EVENTS,
            **NO_BOUNDS_CHECK,
        )
