"""The LayerScale tab: the model's LayerScale per depth (its own figure) and the analysed image's residual-branch
ratios."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from app import session
from app.models import LoadedModel
from cait import explain
from cait.figures import layerscale_plot, residual_ratio_plot, to_plotly


def layerscale_figure(loaded: LoadedModel):
    """The model's LayerScale per depth, beside its init value."""
    return to_plotly(layerscale_plot(explain.layerscale_stats(loaded.model), init_values=loaded.cfg.init_values))


@dataclass
class LayerScaleParts:
    ls_plot: gr.Plot
    ratio_plot: gr.Plot

    @property
    def results(self) -> list:
        """What a new image (or a new model) empties here."""
        return [self.ratio_plot]


def build(figure) -> LayerScaleParts:
    """The tab's components (inside its gr.Tab), with the first model's figure."""
    return LayerScaleParts(
        ls_plot=gr.Plot(value=figure, label="LayerScale per depth", elem_id="ls_plot"),
        ratio_plot=gr.Plot(label="Residual-branch ratio of the analysed image", elem_id="ratio_plot"),
    )


class LayerScaleTab:
    def __init__(self, parts: LayerScaleParts):
        self.parts = parts

    def details(self, a: session.Analysis) -> dict:
        """The follow-up of a new image here: its residual-branch ratios."""
        return {self.parts.ratio_plot: to_plotly(residual_ratio_plot(a.ratios))}

    def cleared(self) -> dict:
        return dict.fromkeys(self.parts.results)

    def for_model(self, loaded: LoadedModel) -> dict:
        return {self.parts.ls_plot: layerscale_figure(loaded)}
