"""A line plot described once (`LinePlot`) and drawn by plotly (the app, HTML files) or matplotlib (PNG
files), so that the interactive and the printed figure show the same lines, bands, axes and labels."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .colours import legend_below

DASH_MATPLOTLIB = {"solid": "-", "dot": ":", "dash": "--"}


@dataclass
class Series:
    """One line of a panel, optionally with a shaded band around it."""

    name: str  # legend entry
    x: list[float]
    y: list[float]
    panel: int = 0  # index of the panel (subplot) it is drawn in
    colour: str | None = None  # CSS / matplotlib colour; None: the renderer's cycle
    dash: str = "solid"  # "solid", "dot" or "dash"
    band: tuple[list[float], list[float]] | None = None  # (low, high) per point, shaded
    hover: list[str] | None = None  # extra text per point, shown on hover (plotly only)
    legend: bool = True  # False: same legend entry as an earlier series


@dataclass
class LinePlot:
    title: str
    panels: list[str]  # subplot titles, side by side, sharing the y axis
    x_label: str
    y_label: str
    series: list[Series]
    log_y: bool = False
    x_ticks: tuple[list[float], list[str]] | None = None  # positions and their labels
    hlines: list[tuple[float, str]] = field(default_factory=list)  # (y, label): dashed, in every panel
    vlines: list[tuple[float, str]] = field(default_factory=list)  # (x, label): thin, in every panel
    height: int = 420  # pixels of the plotly figure


def log_ticks(plot: LinePlot, *, most: int = 10) -> list[float]:
    """Tick values for a log y axis over the plot's values: 1, 2, 5 per decade, only the powers of ten when
    that would be more than `most` ticks (plotly's own minor labels read "2, 1, 9, 8" for 0.2 ... 0.9)."""
    values = [v for s in plot.series for v in (*s.y, *(s.band[0] + s.band[1] if s.band else ())) if v > 0]
    values += [y for y, _ in plot.hlines if y > 0]
    if not values:
        return []
    low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    ticks = [m * 10.0**e for e in range(low, high + 1) for m in (1, 2, 5)]
    ticks = [t for t in ticks if min(values) / 2 <= t <= max(values) * 2] or ticks
    return ticks if len(ticks) <= most else [10.0**e for e in range(low, high + 1)]


def _add_series(fig, s: Series) -> None:
    """One series on its panel: its line with markers and hover, and its band when it has one."""
    where = dict(row=1, col=s.panel + 1)
    line = dict(color=s.colour, dash=s.dash)
    if s.band is not None:
        low, high = s.band
        fig.add_scatter(
            x=s.x + s.x[::-1],
            y=list(high) + list(low)[::-1],
            fill="toself",
            fillcolor=s.colour,
            opacity=0.15,
            line=dict(width=0),
            hoverinfo="skip",
            showlegend=False,
            legendgroup=s.name,
            **where,
        )
    fig.add_scatter(
        x=s.x,
        y=s.y,
        mode="lines+markers",
        name=s.name,
        legendgroup=s.name,
        line=line,
        showlegend=s.legend,
        text=s.hover,
        hovertemplate="%{x}: %{y:.3g}" + ("<br>%{text}" if s.hover else "") + f"<extra>{s.name}</extra>",
        **where,
    )


def _decorate_panel(fig, plot: LinePlot, col: int) -> None:
    """Panel `col` (from 1): the plot's horizontal and vertical reference lines, x ticks and x label."""
    for y, label in plot.hlines:
        fig.add_hline(
            y=y,
            line=dict(color="gray", dash="dash"),
            annotation_text=label,
            annotation_position="bottom right",
            row=1,
            col=col,
        )
    for x, label in plot.vlines:
        fig.add_vline(
            x=x, line=dict(color="lightgray"), annotation_text=label, annotation_position="top", row=1, col=col
        )
    if plot.x_ticks is not None:
        fig.update_xaxes(tickvals=plot.x_ticks[0], ticktext=plot.x_ticks[1], row=1, col=col)
    fig.update_xaxes(title_text=plot.x_label, row=1, col=col)


def to_plotly(plot: LinePlot):
    """The plot as a plotly Figure (hover shows each point's values and `Series.hover`)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1, cols=len(plot.panels), shared_yaxes=True, subplot_titles=plot.panels, horizontal_spacing=0.06
    )
    for s in plot.series:
        _add_series(fig, s)
    for col in range(1, len(plot.panels) + 1):
        _decorate_panel(fig, plot, col)
    # every panel its own axis object of one type, all labelled: a linear axis matched to a log one is ignored
    # by plotly (its ticks then read nothing); "~g" labels every log tick in full (0.9, 0.8, not "9, 8")
    log = dict(type="log", tickformat="~g", tickvals=log_ticks(plot)) if plot.log_y else dict(type="linear")
    fig.update_yaxes(showticklabels=True, **log)
    fig.update_yaxes(title_text=plot.y_label, row=1, col=1)
    fig.update_layout(title=plot.title, template="plotly_white", **legend_below(plot.height + 80))
    return fig


def to_matplotlib(plot: LinePlot, *, width: float = 12.0, height: float = 4.8):
    """The plot as a matplotlib Figure on the file-only backend (for PNG files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(plot.panels), figsize=(width, height), sharey=True, squeeze=False)
    axes = axes[0]
    for s in plot.series:
        ax = axes[s.panel]
        lines = ax.plot(
            s.x, s.y, DASH_MATPLOTLIB[s.dash], marker="o", ms=3, color=s.colour, label=s.name if s.legend else None
        )
        if s.band is not None:
            ax.fill_between(s.x, s.band[0], s.band[1], color=lines[0].get_color(), alpha=0.15, lw=0)
    many = plot.x_ticks is not None and len(plot.x_ticks[0]) > 20
    for ax, title in zip(axes, plot.panels):
        for y, label in plot.hlines:
            ax.axhline(y, color="k", ls="--", lw=1, label=label)
        for x, label in plot.vlines:
            ax.axvline(x, color="lightgray", lw=1)
        if plot.x_ticks is not None:
            ax.set_xticks(plot.x_ticks[0], plot.x_ticks[1], rotation=90 if many else 0, fontsize=7 if many else 9)
        ax.set_title(title)
        ax.set_xlabel(plot.x_label)
        if plot.log_y:
            ax.set_yscale("log")
    axes[0].set_ylabel(plot.y_label)
    labelled = {label: handle for ax in axes for handle, label in zip(*ax.get_legend_handles_labels())}
    if labelled:
        axes[-1].legend(list(labelled.values()), list(labelled), fontsize=7, loc="best")
    fig.suptitle(plot.title)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig
