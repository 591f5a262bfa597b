"""The one colour convention of every figure of a signed number about a class (an attribution, a head's write to the
logit, a restored logit): red for the class, blue against it, white at 0; and where a legend sits below a plot."""

from __future__ import annotations

SIGNED = "RdBu_r"  # the diverging scale, one name in matplotlib and plotly: blue at the low end, red at the high end
FOR_CLASS, AGAINST = "#d6604d", "#4393c3"  # that scale's red and blue, for bars
MODEL_A, MODEL_B = "#1b9e77", "#7570b3"  # two models side by side (a comparison): neither red nor blue
LEGEND_GAP = 64  # pixels between the plot area and a legend below it: room for the tick labels and the axis title


def signed_heatmap(bound: float) -> dict:
    """A plotly heatmap's colour arguments for values in -bound .. bound: 0 white, red for, blue against."""
    bound = float(bound) or 1.0
    return dict(colorscale=SIGNED, zmid=0, zmin=-bound, zmax=bound)


def legend_below(height: int, *, top: int = 70, bottom: int = 130) -> dict:
    """Layout arguments for a figure `height` pixels high whose horizontal legend sits below the x axis's title
    (LEGEND_GAP pixels under the plot area, in the bottom margin), never on it."""
    plot = height - top - bottom
    return dict(
        height=height,
        margin=dict(l=60, r=20, t=top, b=bottom),
        legend=dict(orientation="h", yanchor="top", y=-LEGEND_GAP / plot, x=0, xanchor="left"),
    )
