"""Figures of the app: attention tiles and their PNG grid, LayerScale and residual-ratio plots,
talking-heads views. Pure functions of numbers (no Gradio), so they are easy to test and reuse."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from PIL import Image, ImageDraw, ImageFont

from cait.explain import overlay

TILE = 224         # display side of one attention tile (the model's own input may be 28-448 px)
CAPTION_H = 22     # caption strip above each tile of the PNG grid
COLORMAPS = ("inferno", "viridis", "magma", "jet", "turbo", "gray")


def display_base(view: Image.Image, side: int = TILE) -> Image.Image:
    """The model's input crop enlarged for display; heat maps are upsampled onto it by `overlay`."""
    return view.convert("RGB").resize((side, side), Image.Resampling.BICUBIC)


def tile_caption(layer: int, head: int | None) -> str:
    return f"CA{layer + 1} " + ("mean" if head is None else f"head {head}")


def attention_tiles(view: Image.Image, maps: np.ndarray, *, cmap: str, alpha: float,
                    side: int = TILE) -> list[tuple[Image.Image, str]]:
    """maps [L, heads, g, g] -> row-major tiles: for each CA layer its heads, then the head mean."""
    base = display_base(view, side)
    tiles = []
    for layer, layer_maps in enumerate(maps):
        for head, heat in enumerate(layer_maps):
            tiles.append((overlay(base, torch.from_numpy(heat), cmap=cmap, alpha=alpha), tile_caption(layer, head)))
        tiles.append((overlay(base, torch.from_numpy(layer_maps.mean(0)), cmap=cmap, alpha=alpha),
                      tile_caption(layer, None)))
    return tiles


def grid_png(tiles: list[tuple[Image.Image, str]], columns: int, path: Path, title: str = "") -> Path:
    """Tiles in a grid with their captions (and an optional title line), written as PNG."""
    side = tiles[0][0].width
    rows = -(-len(tiles) // columns)
    top = CAPTION_H if title else 0
    sheet = Image.new("RGB", (columns * side, top + rows * (side + CAPTION_H)), "white")
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default(size=14)
    if title:
        draw.text((6, 3), title, fill="black", font=font)
    for i, (tile, caption) in enumerate(tiles):
        x, y = (i % columns) * side, top + (i // columns) * (side + CAPTION_H)
        draw.text((x + 6, y + 3), caption, fill="black", font=font)
        sheet.paste(tile, (x, y + CAPTION_H))
    sheet.save(path, format="PNG")
    return path


def draw_box(image: Image.Image, box: tuple[float, float, float, float], scale: float,
             colour: str = "#00e0ff") -> Image.Image:
    """A copy of `image` with `box` (model-input pixels, scaled by `scale` to the image) outlined."""
    out = image.copy()
    x0, y0, x1, y1 = (v * scale for v in box)
    ImageDraw.Draw(out).rectangle((x0, y0, x1 - 1, y1 - 1), outline=colour, width=3)
    return out


def layerscale_figure(rows: list[dict], init_values: float) -> go.Figure:
    """Per depth, mean and p10-p90 band of |gamma_1| (attention branch) and |gamma_2| (FFN branch),
    SA blocks then CA blocks on one depth axis, log y, the init eps as a dashed line."""
    fig = go.Figure()
    depth = 1 + max((r["layer"] for r in rows if r["stage"] == "sa"), default=-1)
    colours = {"gamma_1": "#1f77b4", "gamma_2": "#d62728"}
    for stage, dash in (("sa", "solid"), ("ca", "dot")):
        for gamma, colour in colours.items():
            sel = sorted((r for r in rows if r["stage"] == stage and r["gamma"] == gamma), key=lambda r: r["layer"])
            if not sel:
                continue
            x = [r["layer"] + 1 + (depth if stage == "ca" else 0) for r in sel]
            name = f"{stage.upper()} |{gamma}| ({'attention' if gamma == 'gamma_1' else 'FFN'})"
            fig.add_trace(go.Scatter(x=x + x[::-1], y=[r["p90"] for r in sel] + [r["p10"] for r in sel][::-1],
                                     fill="toself", fillcolor=colour, opacity=0.15, line=dict(width=0),
                                     hoverinfo="skip", showlegend=False, legendgroup=name))
            fig.add_trace(go.Scatter(x=x, y=[r["mean"] for r in sel], mode="lines+markers", name=name,
                                     legendgroup=name, line=dict(color=colour, dash=dash),
                                     customdata=[[r["p10"], r["p90"]] for r in sel],
                                     hovertemplate="depth %{x}<br>mean %{y:.3g}<br>p10 %{customdata[0]:.3g}"
                                                   "<br>p90 %{customdata[1]:.3g}<extra></extra>"))
    fig.add_hline(y=init_values, line=dict(color="gray", dash="dash"),
                  annotation_text=f"init eps = {init_values:g}", annotation_position="bottom right")
    if depth:
        fig.add_vline(x=depth + 0.5, line=dict(color="lightgray"),
                      annotation_text="SA | CA", annotation_position="top")
    fig.update_layout(title="LayerScale |gamma| per depth (mean, band = p10-p90 over channels)",
                      xaxis_title="block (SA 1..depth, then CA)", yaxis_title="|gamma|", yaxis_type="log",
                      height=420, margin=dict(l=60, r=20, t=60, b=50), template="plotly_white")
    return fig


def residual_figure(ratios: dict[str, list[float]]) -> go.Figure:
    """Residual-branch ratio ||gamma * branch(x)|| / ||x|| per block for the current image."""
    depth = len(ratios.get("sa", []))
    fig = go.Figure()
    labels = {"sa": "SA attention", "ffn": "SA FFN", "ca": "CA attention", "ca_ffn": "CA FFN"}
    for key, label in labels.items():
        values = ratios.get(key, [])
        offset = depth if key.startswith("ca") else 0
        fig.add_trace(go.Scatter(x=[i + 1 + offset for i in range(len(values))], y=values, mode="lines+markers",
                                 name=label))
    fig.update_layout(title="Residual-branch ratio for this image: ||branch|| / ||residual input||",
                      xaxis_title="block (SA 1..depth, then CA)", yaxis_title="ratio", yaxis_type="log",
                      height=380, margin=dict(l=60, r=20, t=60, b=50), template="plotly_white")
    return fig


def mixing_figure(proj_l: np.ndarray, proj_w: np.ndarray, layer: int) -> go.Figure:
    """The talking-heads mixing matrices of one SA layer (rows: output head, columns: input head)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("proj_l (before softmax)", "proj_w (after softmax)"))
    limit = float(max(np.abs(proj_l).max(), np.abs(proj_w).max(), 1e-12))
    for col, matrix in ((1, proj_l), (2, proj_w)):
        fig.add_trace(go.Heatmap(z=matrix, colorscale="RdBu", zmid=0, zmin=-limit, zmax=limit,
                                 showscale=col == 2, texttemplate="%{z:.2f}",
                                 hovertemplate="out head %{y}<br>in head %{x}<br>%{z:.3f}<extra></extra>"),
                      row=1, col=col)
        fig.update_xaxes(title_text="input head", dtick=1, row=1, col=col)
        fig.update_yaxes(title_text="output head", dtick=1, autorange="reversed", row=1, col=col)
    fig.update_layout(title=f"Talking-heads mixing of SA layer {layer + 1}", height=380,
                      margin=dict(l=60, r=20, t=70, b=50), template="plotly_white")
    return fig


def query_tiles(view: Image.Image, before: np.ndarray, after: np.ndarray, patch: int, *, cmap: str,
                alpha: float, side: int = 160) -> list[tuple[Image.Image, str]]:
    """Where one query patch looks, per head, before and after head mixing (before/after [h, N, N]).
    The query patch is outlined. After mixing the weights can be negative; the overlay min-max scales."""
    g = int(round(before.shape[-1] ** 0.5))
    base = display_base(view, side)
    cell = side / g
    r, c = divmod(patch, g)
    tiles = []
    for stage, attn in (("before", before), ("after", after)):
        for head in range(attn.shape[0]):
            heat = torch.from_numpy(attn[head, patch].reshape(g, g))
            tile = draw_box(overlay(base, heat, cmap=cmap, alpha=alpha), (c * cell, r * cell, (c + 1) * cell,
                                                                        (r + 1) * cell), 1.0)
            tiles.append((tile, f"head {head} {stage} mixing"))
    return tiles
