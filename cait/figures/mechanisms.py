"""Figures of how a prediction forms along depth (`cait.explain.mechanisms`), as plotly for the app and the
atlas page: the logit lens of one image over SA depth, the activation-patching profile over blocks (attention
and MLP branch, a CA block's class token) and the class-attention heads' patching as a grid, each in Δlogit
with the share of the clean-corrupted gap it restores in the hover text."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .colours import legend_below, signed_heatmap
from .layerscale import block_ticks

BRANCH_COLOURS = {"class token": "#7f7f7f", "attention": "#2ca02c", "MLP": "#d62728"}


def depth_words(k: int) -> str:
    """What lens entry k reads, in the app's words: 'the patch embedding' (k = 0), else 'after SA block k'."""
    return "the patch embedding" if k == 0 else f"after SA block {k}"


def where_words(k: int) -> str:
    """Where lens entry k is, to follow a verb: 'at the patch embedding', 'after SA block k'."""
    return f"at {depth_words(k)}" if k == 0 else depth_words(k)


def lens_plotly(
    probability: Sequence[float],
    top1: Sequence[str],
    top1_probability: Sequence[float],
    *,
    target: str,
    forms_at: int | None,
):
    """The lens along SA depth (x = 0: the patch embedding, k: after SA block k): the probability of the class
    `target` (line) and of the lens's own top-1 (bars, named), with a line where the answer (the last top-1,
    the model's prediction) forms: `forms_at`, as `cait.explain.mechanisms.answer_forms_at` gives it."""
    import plotly.graph_objects as go

    x = list(range(len(probability)))
    where = [depth_words(k) for k in x]
    fig = go.Figure()
    fig.add_bar(
        x=x,
        y=list(top1_probability),
        name="the lens's top-1",
        marker_color="#c7c7c7",
        text=list(top1),
        textposition="inside",
        hovertext=[f"{w}: top-1 '{t}' ({p:.3f})" for w, t, p in zip(where, top1, top1_probability)],
        hoverinfo="text",
    )
    fig.add_scatter(
        x=x,
        y=list(probability),
        mode="lines+markers",
        name=f"probability of '{target}'",
        line=dict(color="#1f77b4"),
        hovertext=[f"{w}: '{target}' {p:.3f}" for w, p in zip(where, probability)],
        hoverinfo="text",
    )
    final = top1[-1]  # the model's own answer: where it forms is where the lens's top-1 settles on it
    if forms_at is None:
        title = f"Logit lens: the top-1 settles on the answer '{final}' only after the last SA block"
    else:
        title = f"Logit lens: the answer '{final}' forms {where_words(forms_at)} (the top-1 from there on)"
        fig.add_vline(x=forms_at - 0.5, line_dash="dash", line_color="#1f77b4")
    fig.update_xaxes(tickvals=x, ticktext=["emb"] + [f"SA{k}" for k in x[1:]], title_text="CA stage reads after")
    fig.update_yaxes(title_text="probability", range=[0, 1.02])
    fig.update_layout(title=title, template="plotly_white", **legend_below(400))
    return fig


# A share of the gap means something only when the corruption moved the class's logit by more than single
# components move it on their own: patched alone, components interact and their effects do not add up to the
# gap, so with a small gap the shares swing without bound. One logit (the class's odds against every other class
# changed by a factor e, a probability of 0.73 falling to 0.5) is where that stops on the shipped model: over its
# example images, the 6 with a gap below one logit had shares from -371% to +1394% (4 of them past +-100%), the
# 22 image-corruption pairs at or above it stayed within -95% to +124% (docs/app_api.md). Below it the figures
# show Δlogits and say why.
MEANINGFUL_GAP = 1.0


def gap_too_small(gap: float) -> bool:
    """Whether the clean-corrupted logit gap is too small (below MEANINGFUL_GAP either way, or not a number) for
    shares of it to mean anything."""
    return not abs(gap) >= MEANINGFUL_GAP


def _percent(fraction: float) -> str:
    """A share in whole percent, without the "-0%" of a tiny negative one."""
    said = f"{fraction:.0%}"
    return "0%" if said == "-0%" else said


def _share(value: float, gap: float) -> str:
    return "gap too small for a share" if gap_too_small(gap) else f"{_percent(value / gap)} of the gap"


WHOLE_STREAM = "whole stream patched: the clean run, by construction (orientation)"


def patching_plotly(
    branches: np.ndarray,
    gap: float,
    *,
    class_token: np.ndarray,
    depth: int,
    ca_depth: int,
    title: str,
    errors: np.ndarray | None = None,
    class_token_errors: np.ndarray | None = None,
):
    """Bars per block (model order, SA then CA): Δlogit when its clean attention or MLP branch alone (branches
    [K, 2]) is patched into the corrupted run, and for each CA block but the last when its clean class token is
    (class_token [CA depth - 1]); hover: the share of the gap `gap` it restores (for means over images: the
    mean Δlogit over the mean gap). errors [K, 2] and class_token_errors [CA depth - 1]: half widths drawn as
    error bars. The whole stream is no bar (patched after an SA block or the last CA block it is the clean run
    by construction): a dotted line at the gap, labelled as that orientation, without an interval."""
    import plotly.graph_objects as go

    ticks, labels = block_ticks(depth, ca_depth)
    bars = [("attention", ticks, labels, branches[:, 0]), ("MLP", ticks, labels, branches[:, 1])]
    ca = slice(depth, depth + len(class_token))
    bars.append(("class token", ticks[ca], labels[ca], class_token))
    spread = [None if errors is None else errors[:, 0], None if errors is None else errors[:, 1], class_token_errors]
    fig = go.Figure()
    for (name, x, names, values), error in zip(bars, spread):
        fig.add_bar(
            x=x,
            y=[float(v) for v in values],
            name=f"{name} patched",
            marker_color=BRANCH_COLOURS[name],
            error_y=None if error is None else dict(type="data", array=[float(e) for e in error]),
            hovertext=[f"{b} {name}: Δlogit {v:+.3f}, {_share(float(v), gap)}" for b, v in zip(names, values)],
            hoverinfo="text",
        )
    fig.add_hline(
        y=gap, line_dash="dot", annotation_text=f"gap {gap:.2f}: {WHOLE_STREAM}", annotation_position="top left"
    )
    fig.update_xaxes(tickvals=ticks, ticktext=labels, title_text="block")
    fig.update_yaxes(title_text="Δlogit restored")
    fig.update_layout(title=title, barmode="group", template="plotly_white", **legend_below(420))
    return fig


def heads_plotly(heads: np.ndarray, gap: float, *, title: str, ci95: np.ndarray | None = None):
    """The CA heads' patching [L, heads] as a grid in Δlogit (zero-centred), each cell's share of the gap written
    in it; ci95 [L, heads, 2]: the 95% interval of each share, written under it (over a dataset)."""
    import plotly.graph_objects as go

    if gap_too_small(gap):  # the Δlogits themselves, the shares would mean nothing
        text = [[f"{float(v):+.2f}" for v in row] for row in heads]
        hover = "%{y} %{x}: Δlogit %{z:.3f} (the gap is too small for a share)<extra></extra>"
    else:
        text = [[_share(float(v), gap).replace(" of the gap", "") for v in row] for row in heads]
        hover = "%{y} %{x}: Δlogit %{z:.3f} (%{text} of the gap)<extra></extra>"
    if ci95 is not None and not gap_too_small(gap):
        text = [[f"{t}<br>[{_percent(lo)}, {_percent(hi)}]" for t, (lo, hi) in zip(r, c)] for r, c in zip(text, ci95)]
    fig = go.Figure(
        go.Heatmap(
            z=heads,
            x=[f"head {h + 1}" for h in range(heads.shape[1])],
            y=[f"CA{c + 1}" for c in range(heads.shape[0])],
            text=text,
            texttemplate="%{text}",
            hovertemplate=hover,
            colorbar=dict(title="Δlogit"),
            **signed_heatmap(np.abs(heads).max()),
        )
    )
    fig.update_xaxes(title_text="head")
    fig.update_yaxes(autorange="reversed", title_text="CA layer")
    # a plot area of 200 px at least: the colour bar spans it (the whole figure of 260 px squeezed it to ~80)
    fig.update_layout(
        title=title, template="plotly_white", height=320 + 50 * heads.shape[0], margin=dict(l=70, r=20, t=70, b=50)
    )
    return fig
