"""The figures of a comparison of two models (`cait.compare`), in plotly for its page and the app: CKA between
every two blocks, the head-similarity matrix with the matching marked, and per matched head pair the difference of
each number with its interval."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .colours import signed_heatmap


def _short(block: str) -> str:
    """'blocks.3' -> 'SA4', 'blocks_token_only.0' -> 'CA1' (numbered from 1, as the figures number layers)."""
    stage, index = block.rsplit(".", 1)
    return f"{'CA' if stage == 'blocks_token_only' else 'SA'}{int(index) + 1}"


def cka_plotly(cka: np.ndarray, blocks_a: Sequence[str], blocks_b: Sequence[str], *, names: tuple[str, str]):
    """Linear CKA [blocks of A, blocks of B] as a heatmap from 0 to 1, A's blocks down, B's across."""
    import plotly.graph_objects as go

    fig = go.Figure(
        go.Heatmap(
            z=cka,
            x=[_short(b) for b in blocks_b],
            y=[_short(b) for b in blocks_a],
            zmin=0,
            zmax=1,
            colorscale="Viridis",
            colorbar=dict(title="CKA"),
            hovertemplate="A %{y}, B %{x}: CKA %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title="Linear CKA between every block of A and every block of B",
        xaxis_title=f"B: {names[1]}",
        yaxis_title=f"A: {names[0]}",
        yaxis_autorange="reversed",
        height=460,
    )
    return fig


def head_similarity_plotly(similarity: np.ndarray, heads_a: Sequence, heads_b: Sequence, matching: Sequence):
    """The mean Spearman correlation of every head of A (down) with every head of B (across) on a -1..1 scale,
    the one-to-one matching circled. heads: (layer, head) from 1; matching: (head_a, head_b, similarity)."""
    import plotly.graph_objects as go

    label = lambda h: f"CA{h[0]} h{h[1]}"  # noqa: E731
    xs, ys = [label(h) for h in heads_b], [label(h) for h in heads_a]
    bound = float(np.nanmax(np.abs(similarity))) if np.isfinite(similarity).any() else 1.0
    fig = go.Figure(
        go.Heatmap(
            z=similarity,
            x=xs,
            y=ys,
            **signed_heatmap(bound),
            colorbar=dict(title="Spearman"),
            hovertemplate="A %{y}, B %{x}: %{z:.3f}<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[label(b) for _, b, _ in matching],
            y=[label(a) for a, _, _ in matching],
            mode="markers",
            marker=dict(symbol="circle-open", size=16, color="black", line=dict(width=2)),
            name="matched",
            hoverinfo="skip",
        )
    )
    fig.update_layout(
        title="Head similarity (mean rank correlation of the maps on the image's pixels), the matching circled",
        xaxis_title="heads of B",
        yaxis_title="heads of A",
        yaxis_autorange="reversed",
        height=520,
        showlegend=False,
    )
    return fig


def head_differences_plotly(rows: Sequence[dict], numbers: Sequence[str], titles: dict[str, str]):
    """Per number (one panel each) and matched pair: B minus A with its 95% interval. rows: heads.csv's rows."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=len(numbers), subplot_titles=[titles[n] for n in numbers])
    pairs = [f"{r['head_a']} / {r['head_b']}" for r in rows]
    for k, n in enumerate(numbers, start=1):
        diff = np.array([np.nan if r[f"{n}_difference"] is None else r[f"{n}_difference"] for r in rows], float)
        low = np.array([np.nan if r[f"{n}_ci_low"] is None else r[f"{n}_ci_low"] for r in rows], float)
        high = np.array([np.nan if r[f"{n}_ci_high"] is None else r[f"{n}_ci_high"] for r in rows], float)
        fig.add_trace(
            go.Scatter(
                x=diff,
                y=pairs,
                mode="markers",
                error_x=dict(type="data", symmetric=False, array=high - diff, arrayminus=diff - low),
                marker=dict(color="black"),
                hovertemplate="%{y}: B - A %{x:.3g}<extra></extra>",
            ),
            row=1,
            col=k,
        )
        fig.add_vline(x=0, line=dict(color="grey", dash="dot"), row=1, col=k)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(
        title="Matched heads: B minus A, with 95% bootstrap intervals", showlegend=False, height=140 + 28 * len(rows)
    )
    return fig
