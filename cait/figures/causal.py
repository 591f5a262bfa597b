"""Figures of what matters for a prediction (`cait.explain.causal`), as plotly for the app and HTML files
and as matplotlib for PNG files: the knockout profile over depth beside mean |gamma| on a second axis,
each class-attention head's direct logit attribution, and the logit built from its parts (a waterfall)."""

from __future__ import annotations

import itertools
from typing import Sequence

from .colours import AGAINST, FOR_CLASS, legend_below
from .layerscale import STAGE_COLOUR, block_position, block_ticks

GAMMA_COLOUR = "#2ca02c"


def _positions(depth: int, ca_depth: int) -> tuple[list[int], list[str]]:
    stages = ["sa"] * depth + ["ca"] * ca_depth
    pos = [block_position("sa", i, depth) for i in range(depth)] + [
        block_position("ca", i, depth) for i in range(ca_depth)
    ]
    return pos, [STAGE_COLOUR[s] for s in stages]


def knockout_plotly(
    delta: Sequence[float],
    gamma: Sequence[float],
    *,
    depth: int,
    ca_depth: int,
    error: Sequence[float] | None = None,
    title: str = "Knockout profile: change of the logit with a block's gammas set to 0",
    gamma_name: str = "mean |gamma|",
):
    """Bars: the logit change per block (model order, SA then CA), one trace per stage so that each legend
    mark has its bars' colour; markers on a second, log y axis: the block's `gamma_name` (mean |gamma|).
    `error`: half-widths drawn as error bars (e.g. a 95% interval of the mean)."""
    from plotly.subplots import make_subplots

    pos, colours = _positions(depth, ca_depth)
    ticks, labels = block_ticks(depth, ca_depth)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for stage, part in (("SA", slice(0, depth)), ("CA", slice(depth, depth + ca_depth))):
        fig.add_bar(
            x=pos[part],
            y=list(delta)[part],
            marker_color=colours[part][0] if colours[part] else None,
            name=f"logit change, {stage} block knocked out",
            error_y=None if error is None else dict(type="data", array=list(error)[part], visible=True),
            hovertext=labels[part],
            hovertemplate="%{hovertext} knocked out: logit change %{y:.3f}<extra></extra>",
        )
    fig.add_scatter(
        x=pos,
        y=list(gamma),
        mode="lines+markers",
        line=dict(color=GAMMA_COLOUR, dash="dot"),
        name=f"{gamma_name} (right axis)",
        hovertext=labels,
        hovertemplate=f"%{{hovertext}}: {gamma_name} %{{y:.3g}}<extra></extra>",
        secondary_y=True,
    )
    fig.update_xaxes(tickvals=ticks, ticktext=labels, title_text="block")
    fig.update_yaxes(title_text="logit change", secondary_y=False)
    fig.update_yaxes(title_text=gamma_name, type="log", secondary_y=True)
    fig.update_layout(title=title, template="plotly_white", **legend_below(420))
    return fig


def knockout_matplotlib(ax, delta, gamma, *, depth: int, ca_depth: int, error=None) -> None:
    """The same figure on a matplotlib axis (a twin axis for |gamma|)."""
    pos, colours = _positions(depth, ca_depth)
    ticks, labels = block_ticks(depth, ca_depth)
    ax.bar(pos, list(delta), color=colours, yerr=None if error is None else list(error), capsize=2)
    ax.axhline(0, color="#444", lw=0.6)
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylabel("logit change when knocked out")
    twin = ax.twinx()
    twin.plot(pos, list(gamma), ":o", color=GAMMA_COLOUR, ms=4, label="mean |gamma|")
    twin.set_yscale("log")
    twin.set_ylabel("mean |gamma|", color=GAMMA_COLOUR)


LAYER_COLOURS = ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")  # CA layer -> its bars


def head_attribution_plotly(heads, parts: Sequence[tuple[str, float]], *, title: str, removal=None):
    """Grouped bars: one group per head, one bar per CA layer ([L, heads] values, numbered from 1); with
    `removal` ([L, heads]: the logit's change when the head is removed), a hatched bar of it beside each
    layer's direct write, in the same units (logit). Beside them a waterfall that builds the logit from its
    `parts` ((name, write) in the order the class token receives them), so the heads' share can be read."""
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.55, 0.45],
        subplot_titles=("each head (logit)", "the logit, part by part"),
        horizontal_spacing=0.1,
    )
    for layer, row in enumerate(heads):
        colour = LAYER_COLOURS[layer % len(LAYER_COLOURS)]
        x = [f"head {h + 1}" for h in range(len(row))]
        named = f"CA{layer + 1}" if removal is None else f"CA{layer + 1} direct write"
        fig.add_bar(
            x=x,
            y=[float(v) for v in row],
            name=named,
            marker_color=colour,
            customdata=[[layer, h] for h in range(len(row))],
            hovertemplate=f"{named}, %{{x}}: %{{y:.3f}} logit<extra></extra>",
            row=1,
            col=1,
        )
        if removal is not None:
            fig.add_bar(
                x=x,
                y=[float(v) for v in removal[layer]],
                name=f"CA{layer + 1} effect of removal (zero ablation)",
                marker=dict(color="white", line=dict(color=colour, width=2), pattern=dict(shape="/", fgcolor=colour)),
                customdata=[[layer, h] for h in range(len(row))],
                hovertemplate=f"CA{layer + 1} %{{x}} removed: logit change %{{y:.3f}}<extra></extra>",
                row=1,
                col=1,
            )
    add_logit_waterfall(fig, parts, row=1, col=2)
    fig.update_layout(title=title, barmode="group", template="plotly_white", **legend_below(420))
    fig.update_xaxes(title_text="head", row=1, col=1)
    fig.update_xaxes(title_text="part", row=1, col=2)
    fig.update_yaxes(title_text="logit (direct write; change on removal)", row=1, col=1)
    return fig


def add_logit_waterfall(fig, parts: Sequence[tuple[str, float]], *, row: int | None = None, col: int | None = None):
    """A waterfall on `fig` that builds the logit from its parts ((name, write) in the order the class token
    receives them), the logit itself as the last bar."""
    import plotly.graph_objects as go

    names, values = [n for n, _ in parts], [float(v) for _, v in parts]
    levels = [0.0, *itertools.accumulate(values)]  # where the waterfall's bars start and end
    low, high = min(levels), max(levels)
    pad = 0.15 * ((high - low) or 1.0)  # room for the value printed beyond each bar
    fig.add_trace(
        go.Waterfall(
            x=[*names, "logit"],
            y=[*values, sum(values)],
            measure=["relative"] * len(values) + ["total"],
            texttemplate="%{y:.2f}",
            textposition="outside",
            hovertemplate="%{x}: %{delta:.3f}, the logit so far %{final:.3f}<extra></extra>",
            connector=dict(line=dict(color="#999", width=1)),
            # red for the class, blue against it, as the per-patch maps (plotly's default red is "against")
            increasing=dict(marker=dict(color=FOR_CLASS)),
            decreasing=dict(marker=dict(color=AGAINST)),
            totals=dict(marker=dict(color="#777777")),
            showlegend=False,
        ),
        row=row,
        col=col,
    )
    fig.update_yaxes(range=[low - pad, high + pad], row=row, col=col)
    return fig


def logit_parts_plotly(parts: Sequence[tuple[str, float]], *, title: str = "The logit, part by part"):
    """The logit built from its parts as a figure of its own."""
    import plotly.graph_objects as go

    fig = add_logit_waterfall(go.Figure(), parts)
    fig.update_layout(title=title, template="plotly_white", height=420, yaxis_title="write to the logit")
    return fig


def logit_parts_matplotlib(ax, parts: Sequence[tuple[str, float]]) -> None:
    """The same waterfall on a matplotlib axis: each part a bar from the running sum, the logit last."""
    names, values = [n for n, _ in parts], [float(v) for _, v in parts]
    starts = [0.0, *itertools.accumulate(values)][:-1]
    colours = [FOR_CLASS if v >= 0 else AGAINST for v in values]
    ax.bar(range(len(values)), values, bottom=starts, color=colours)
    ax.bar(len(values), sum(values), color="#1f77b4")
    for k, (start, v) in enumerate(zip([*starts, 0.0], [*values, sum(values)])):
        ax.annotate(
            f"{v:+.2f}" if k < len(values) else f"{v:.2f}",
            (k, max(start, start + v)),
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax.set_xticks(range(len(values) + 1), [*names, "logit"], rotation=35, ha="right", fontsize=7)
    ax.axhline(0, color="#444", lw=0.6)
    ax.margins(y=0.12)  # room for the values printed above the bars
    ax.set_ylabel("write to the logit")
