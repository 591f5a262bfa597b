"""Figures built once and drawn by both front ends: the app shows them with plotly, the analysis scripts
write the same figure as PNG (matplotlib or PIL) and HTML (plotly). A builder turns numbers into a
figure description (`LinePlot`, attention `Tile`s); the renderers know nothing about CaiT."""

from .attention import (
    TILE,
    Tile,
    attention_tile,
    attention_tiles,
    colour_bar,
    display_base,
    grid_columns,
    head_name,
    tile_sheet,
)
from .distance import distance_plot
from .layerscale import layerscale_epochs_plot, layerscale_plot, residual_ratio_plot
from .lines import LinePlot, Series, to_matplotlib, to_plotly

__all__ = [
    "LinePlot",
    "Series",
    "TILE",
    "Tile",
    "attention_tile",
    "attention_tiles",
    "display_base",
    "distance_plot",
    "head_name",
    "colour_bar",
    "grid_columns",
    "layerscale_epochs_plot",
    "layerscale_plot",
    "residual_ratio_plot",
    "tile_sheet",
    "to_matplotlib",
    "to_plotly",
]
