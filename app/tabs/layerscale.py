"""The LayerScale tab: the model's LayerScale per depth (its own figure) and the analysed image's residual-branch
ratios."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from app import session
from app.models import LoadedModel
from app.page_tab import PageTab
from cait.explain.layerscale import layerscale_stats
from cait.figures import layerscale_plot, residual_ratio_plot, to_plotly


def layerscale_figure(loaded: LoadedModel):
    """The model's LayerScale per depth, beside its init value."""
    return to_plotly(layerscale_plot(layerscale_stats(loaded.model), init_values=loaded.cfg.init_values))


@dataclass
class LayerScaleParts:
    ls_plot: gr.Plot
    ratio_plot: gr.Plot

    @property
    def results(self) -> list:
        """What a new image (or a new model) empties here."""
        return [self.ratio_plot]


def build(first: LoadedModel, tab: gr.Tab) -> LayerScaleParts:
    """The tab's components (inside its gr.Tab), with the first model's figure."""
    figure = layerscale_figure(first)
    return LayerScaleParts(
        ls_plot=gr.Plot(value=figure, label="LayerScale per depth", elem_id="ls_plot"),
        ratio_plot=gr.Plot(label="Residual-branch ratio of the analysed image", elem_id="ratio_plot"),
    )


class LayerScaleTab(PageTab):
    def __init__(self, parts: LayerScaleParts):
        self.parts = parts

    @classmethod
    def on_page(cls, parts: LayerScaleParts, page: Any) -> LayerScaleTab:
        return cls(parts)

    def detailed(self) -> list:
        return [self.parts.ratio_plot]

    def details(self, loaded: LoadedModel, a: session.Analysis, ask: Any) -> dict:
        """The follow-up of a new image here: its residual-branch ratios."""
        return {self.parts.ratio_plot: to_plotly(residual_ratio_plot(a.ratios))}

    def for_model(self, loaded: LoadedModel) -> dict:
        return {self.parts.ls_plot: layerscale_figure(loaded)}
