"""The Talking heads tab: where one query patch looks in a self-attention layer, per head, at each stage of the
talking-heads computation, the patch picker, and the two mixing matrices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

import cait
from app import figures, session, torch_thread
from app.models import LoadedModel, ModelCache, ModelChoice
from app.shared import MODEL_EVENTS, Shared, answering, named
from app.workdir import WORK
from cait import explain


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


@dataclass(frozen=True)
class QueryAsk:
    """What a slider of the query sends (by name)."""

    choice: ModelChoice
    analysis: session.Analysis | None
    th_layer: int
    th_row: int
    th_col: int


def build(first: LoadedModel) -> TalkingHeadsParts:
    """The tab's components (inside its gr.Tab)."""
    gr.Markdown(
        "Where one query patch (outlined) looks in a self-attention layer, per head, at each stage of the "
        "talking-heads computation: the raw per-head softmax(QK^T), which the model never computes; after "
        "proj_l mixes the logits across heads and the softmax; after proj_w mixes the weights (what "
        "multiplies the values). Below, the two mixing matrices."
    )
    g = first.cfg.grid_size
    with gr.Row():
        th_layer = gr.Slider(1, first.cfg.depth, value=1, step=1, label="SA layer", elem_id="th_layer")
        th_row = gr.Slider(1, g, value=g // 2 + 1, step=1, label="Query patch row", elem_id="th_row")
        th_col = gr.Slider(1, g, value=g // 2 + 1, step=1, label="Query patch column", elem_id="th_col")
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


class TalkingHeadsTab:
    """The tab's events and what it draws."""

    def __init__(self, parts: TalkingHeadsParts, shared: Shared, cache: ModelCache):
        self.parts, self.shared, self.cache = parts, shared, cache

    def outputs(self, loaded: LoadedModel, a: session.Analysis, row: int, col: int) -> dict:
        g = loaded.cfg.grid_size
        patch = (min(max(int(row), 1), g) - 1) * g + min(max(int(col), 1), g) - 1
        st = a.stages
        tiles = figures.query_tiles(
            a.view, {"raw": st.raw, "after_proj_l": st.after_proj_l, "after_proj_w": st.after_proj_w}, patch
        )
        proj_l, proj_w = (m.float().cpu().numpy() for m in explain.mixing_matrices(loaded.model, st.layer))
        files = figures.save_tiles([image for image, _ in tiles], WORK.request_dir(), "query")
        # a value only: the columns follow the model (`for_model`)
        return {
            self.parts.th_gallery: [(f, caption) for f, (_, caption) in zip(files, tiles)],
            self.parts.th_plot: figures.mixing_figure(proj_l, proj_w, st.layer),
            self.parts.th_pick: figures.query_picker(a.view, g, patch),
        }

    def query(self, **asked: Any) -> dict:
        """Another SA layer or query patch. asked: the fields of `QueryAsk`, by name."""
        ask = QueryAsk(**asked)
        a = ask.analysis
        if a is None or a.choice != ask.choice:
            return gr.skip()
        loaded = self.cache.get(ask.choice)
        a = session.with_sa_layer(loaded, a, int(ask.th_layer) - 1)
        return {self.shared.analysis: a, **self.outputs(loaded, a, ask.th_row, ask.th_col)}

    def pick(self, choice, a, layer, evt: gr.SelectData) -> dict:
        """A click on the patch-grid image: that patch becomes the query (the sliders follow)."""
        if a is None or a.choice != choice:
            return gr.skip()
        g = self.cache.get(choice).cfg.grid_size
        x, y = evt.index  # pixels of the picker image
        row, col = (min(int(v * g / figures.PICKER_SIDE), g - 1) + 1 for v in (y, x))
        out = self.query(choice=choice, analysis=a, th_layer=layer, th_row=row, th_col=col)
        return {self.parts.th_row: row, self.parts.th_col: col, **out}

    def cleared(self) -> dict:
        return dict.fromkeys(self.parts.results)

    def for_model(self, loaded: LoadedModel) -> dict:
        p, cfg, g = self.parts, loaded.cfg, loaded.cfg.grid_size
        return {
            p.th_layer: gr.Slider(maximum=cfg.depth, value=1),
            p.th_row: gr.Slider(maximum=g, value=g // 2 + 1),
            p.th_col: gr.Slider(maximum=g, value=g // 2 + 1),
            p.th_gallery: gr.Gallery(value=None, columns=talking_columns(cfg)),
        }

    def wire(self) -> None:
        p, shared, on_torch = self.parts, self.shared, torch_thread.handler
        shown = [shared.analysis, p.th_gallery, p.th_plot, p.th_pick]
        # input, not release: arrow keys and a typed value + Enter redraw too (a drag's steps: only the latest);
        # not change, which a programmatic value (a click on the patch grid, a new model) would also fire
        for slider in (p.th_layer, p.th_row, p.th_col):
            slider.input(
                on_torch(answering(self.query)),
                inputs_kwargs=named(p, QueryAsk, choice=shared.choice, analysis=shared.analysis),
                outputs=shown,
                trigger_mode="always_last",
                **MODEL_EVENTS,
            )
        p.th_pick.select(
            on_torch(answering(self.pick)),
            [shared.choice, shared.analysis, p.th_layer],
            [p.th_row, p.th_col, *shown],
            **MODEL_EVENTS,
        )
