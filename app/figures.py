"""Figures only the app shows: saliency tiles, the region of focus, talking-heads views. Pure functions
of numbers (no Gradio). The class-attention grid and the LayerScale plots are shared with the analysis
scripts and live in `cait.figures`."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch
from PIL import Image, ImageDraw
from plotly.subplots import make_subplots

from app.workdir import WORK
from cait.explain.maps import overlay, overlays
from cait.figures.attention import TILE, display_base
from cait.figures.colours import SIGNED, legend_below, signed_heatmap

COLORMAPS = ("inferno", "viridis", "magma", "jet", "turbo", "gray")
STAGE_LABELS = {  # the talking-heads stages, in the order the model computes them
    "raw": "raw softmax(QK^T) (not computed by the model)",
    "after_proj_l": "after proj_l + softmax",
    "after_proj_w": "after proj_w (what the model uses)",
}


# Tile encodings, measured on the app's 224 px tiles (one thread; xxs24_224 on a photo / the shipped model
# on a scene): JPEG quality 90 without colour subsampling (4:4:4) 0.2 ms a tile, 13-16 kB, mean error 1.6
# levels (max 16-17 on the smooth view); lossy WebP (quality 90, method 0) took 1.2-2.1 ms for 6-10 kB and
# mean error 2.0-2.2 (max 25-26), lossless WebP 0.7-1.4 ms for 26-65 kB, PNG 1.5-3.3 ms. A view has 10-34
# tiles and waits for all of them, so the smooth maps go JPEG; the patch grid, whose flat blocks are the
# data (JPEG rings at their edges: max 39 levels off), stays lossless.
SMOOTH_TILE = dict(format="JPEG", quality=90, subsampling=0)
EXACT_TILE = dict(format="WEBP", lossless=True, quality=0, method=0)


def save_tiles(images: list[Image.Image], folder: Path, stem: str, *, exact: bool = False) -> list[str]:
    """The tiles as files in `folder` (stem_0.jpg, ...), for a gallery to serve as they are: lossless WebP
    with `exact` (the browser shows exactly the pixels drawn: the patch-grid view), else JPEG (see
    SMOOTH_TILE). Either beats Gradio's own encoding (4 ms a tile) and PNG."""
    kind = EXACT_TILE if exact else SMOOTH_TILE
    paths = []
    for i, image in enumerate(images):
        path = folder / f"{stem}_{i}.{'webp' if exact else 'jpg'}"
        image.save(path, **kind)
        paths.append(str(path))
    return paths


def image_file(image: Image.Image, stem: str, *, folder: Path | None = None) -> str:
    """`image` as a lossless file in `folder` (default: a fresh request folder), for an output to serve. Gradio
    copies a file into its cache once (by a rename), where it re-encodes an image into the cache file named by its
    content on every answer, truncating that file under any page still fetching the same image from an earlier
    answer."""
    return save_tiles([image], folder or WORK.request_dir(), stem, exact=True)[0]


def draw_box(
    image: Image.Image, box: tuple[float, float, float, float], scale: float, colour: str = "#00e0ff"
) -> Image.Image:
    """A copy of `image` with `box` (model-input pixels, scaled by `scale` to the image) outlined."""
    out = image.copy()
    x0, y0, x1, y1 = (v * scale for v in box)
    ImageDraw.Draw(out).rectangle((x0, y0, x1 - 1, y1 - 1), outline=colour, width=3)
    return out


def region_image(
    view: Image.Image, mask: torch.Tensor, box: tuple[float, float, float, float], img_size: int
) -> Image.Image:
    """The region of focus bright on the dimmed image, with its box."""
    base = display_base(view)
    region = overlay(base, mask.float(), cmap="gray", alpha=0.45, smooth=False)
    return draw_box(region, box, base.width / img_size)


SIGNED_CMAP = SIGNED  # signed attributions: blue against the class, white 0, red for it


def saliency_tile(
    view: Image.Image, heat: torch.Tensor, *, cmap: str, alpha: float, smooth: bool = True, signed: bool = False
) -> Image.Image:
    """One saliency map over the image, spanning its own min .. max; a signed map in SIGNED_CMAP over
    -|max| .. |max|, so that 0 is white whatever the map's range."""
    if signed:
        top = max(float(heat.abs().max()), 1e-12)
        return overlay(display_base(view), heat, cmap=SIGNED_CMAP, alpha=alpha, smooth=smooth, value_range=(-top, top))
    return overlay(display_base(view), heat, cmap=cmap, alpha=alpha, smooth=smooth)


def saliency_bars(cmap: str, *, signed: bool) -> Image.Image:
    """The saliency tab's colour scale; with signed maps, the signed methods' diverging scale below it."""
    from cait.figures import colour_bar

    bar = colour_bar(cmap, "each map's min", "each map's max")
    if not signed:
        return bar
    below = colour_bar(SIGNED_CMAP, "signed maps: -|max|, against the class", "for it: +|max|", width=bar.width + 140)
    both = Image.new("RGB", (max(bar.width, below.width), bar.height + below.height + 6), "white")
    both.paste(bar, (0, 0))
    both.paste(below, (0, bar.height + 6))
    return both


PLOTLY_SCALES = {
    "inferno": "Inferno",
    "viridis": "Viridis",
    "magma": "Magma",
    "jet": "Jet",
    "turbo": "Turbo",
    "gray": "gray",
    SIGNED: SIGNED,
}


def _png_uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_under(fig: go.Figure, view: Image.Image, g: int, *, axis: str = "") -> None:
    """The model's view under the patch-grid heat map on axes x{axis}/y{axis} (cells 1..g from the top left)."""
    fig.add_layout_image(
        source=display_base(view, 448),
        xref=f"x{axis}",
        yref=f"y{axis}",
        x=0.5,
        y=0.5,
        sizex=g,
        sizey=g,
        xanchor="left",
        yanchor="top",
        sizing="stretch",
        layer="below",
    )


def enlarged_figure(
    tile: Image.Image,
    view: Image.Image,
    heat: np.ndarray,
    *,
    cmap: str,
    title: str,
    colour_title: str = "attention",
    signed: bool = False,
) -> go.Figure:
    """The selected tile as shown (left) beside its patch grid as it is, one block per patch, over the
    image (right), whose hover gives the value under the cursor with its row and column (from 1).
    colour_title names what the colours measure; a `signed` map spans -|max| .. |max| like its tile, so that
    white is 0 in both panels."""
    g = heat.shape[-1]
    limits = signed_heatmap(max(float(np.abs(heat).max()), 1e-12)) if signed else {}
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("as in the grid", "patch grid (hover: the value)"), horizontal_spacing=0.04
    )
    # as a PNG, not z: a 448 px tile as z is 1.7 MB of JSON that the browser parses and draws pixel by pixel
    fig.add_trace(go.Image(source=_png_uri(tile), hoverinfo="skip"), row=1, col=1)
    cells = list(range(1, g + 1))
    fig.add_trace(
        go.Heatmap(
            z=heat,
            x=cells,
            y=cells,
            opacity=0.6,
            zsmooth=False,
            colorbar=dict(title=colour_title, len=0.8),
            hovertemplate="row %{y}, column %{x}: %{z:.4f}<extra></extra>",
            **({"colorscale": PLOTLY_SCALES.get(cmap, "Inferno")} | limits),
        ),
        row=1,
        col=2,
    )
    image_under(fig, view, g, axis="2")
    fig.update_xaxes(visible=False, row=1, col=1)
    fig.update_yaxes(visible=False, row=1, col=1)
    fig.update_xaxes(range=[0.5, g + 0.5], constrain="domain", showgrid=False, title_text="column", row=1, col=2)
    fig.update_yaxes(
        range=[g + 0.5, 0.5], scaleanchor="x2", constrain="domain", showgrid=False, title_text="row", row=1, col=2
    )
    fig.update_layout(title=title, height=500, margin=dict(l=20, r=20, t=70, b=20), template="plotly_white")
    return fig


def mixing_figure(proj_l: np.ndarray, proj_w: np.ndarray, layer: int) -> go.Figure:
    """The talking-heads mixing matrices of one SA layer (rows: output head, columns: input head, from 1)."""
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("proj_l (mixes the logits, before the softmax)", "proj_w (mixes the weights, after it)"),
    )
    limit = float(max(np.abs(proj_l).max(), np.abs(proj_w).max(), 1e-12))
    heads = list(range(1, proj_l.shape[0] + 1))
    for col, matrix in ((1, proj_l), (2, proj_w)):
        fig.add_trace(
            go.Heatmap(
                z=matrix,
                x=heads,
                y=heads,
                **signed_heatmap(limit),
                showscale=col == 2,
                texttemplate="%{z:.2f}" if len(heads) <= 8 else None,
                hovertemplate="out head %{y}<br>in head %{x}<br>%{z:.3f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="input head", dtick=1, row=1, col=col)
        fig.update_yaxes(title_text="output head", dtick=1, autorange="reversed", row=1, col=col)
    fig.update_layout(
        title=f"Talking-heads mixing of SA layer {layer + 1}",
        height=380 + 10 * max(0, len(heads) - 8),
        margin=dict(l=60, r=20, t=70, b=50),
        template="plotly_white",
    )
    return fig


DISTANCE_LOOKS = {  # SA stage -> (its name on the plot, colour)
    "after_proj_l": ("softmax after proj_l", "#1f77b4"),
    "after_proj_w": ("|w| after proj_w", "#ff7f0e"),
}


def _add_distances(fig: go.Figure, distances: dict[str, np.ndarray], uniform: float) -> None:
    """Left panel: each SA head's mean attention distance [SA layers, heads] as dots and their mean per layer,
    for each stage it is read from (DISTANCE_LOOKS), and the level of uniform attention dashed."""
    for stage, distance in distances.items():
        name, colour = DISTANCE_LOOKS[stage]
        layers, heads = distance.shape
        fig.add_scatter(
            x=np.repeat(np.arange(1, layers + 1), heads),
            y=distance.reshape(-1),
            mode="markers",
            marker=dict(size=7, color=colour, opacity=0.6),
            text=[f"SA{layer + 1} head {head + 1}" for layer in range(layers) for head in range(heads)],
            hovertemplate=f"%{{text}}, {name}: %{{y:.1f}} px<extra></extra>",
            name=f"one head, {name}",
            row=1,
            col=1,
        )
        fig.add_scatter(
            x=list(range(1, layers + 1)),
            y=distance.mean(1),
            mode="lines",
            line=dict(color=colour),
            name=f"head mean, {name}",
            hovertemplate=f"SA%{{x}} head mean, {name}: %{{y:.1f}} px<extra></extra>",
            row=1,
            col=1,
        )
    fig.add_hline(
        y=uniform,
        line=dict(color="gray", dash="dash"),
        annotation_text=f"uniform attention: {uniform:.1f} px",
        annotation_position="bottom right",
        row=1,
        col=1,
    )


def _add_entropies(fig: go.Figure, entropy: np.ndarray, patches: int) -> None:
    """Right panel: each CA head's entropy [CA layers, heads] as grouped bars, uniform attention dashed."""
    for layer, row in enumerate(entropy):
        fig.add_bar(
            x=list(range(1, len(row) + 1)),
            y=row,
            name=f"CA{layer + 1}",
            hovertemplate=f"CA{layer + 1} head %{{x}}: %{{y:.2f}} nats<extra></extra>",
            row=1,
            col=2,
        )
    fig.add_hline(
        y=float(np.log(patches)),
        line=dict(color="gray", dash="dash"),
        annotation_text=f"uniform: ln {patches}",
        annotation_position="bottom right",
        row=1,
        col=2,
    )


def head_stats_figure(
    entropy: np.ndarray, distances: dict[str, np.ndarray], *, patches: int, uniform_distance: float
) -> go.Figure:
    """The per-head statistics of one image: each SA head's mean attention distance (pixels) against depth, as
    in the ViT paper's figure, on the softmax after proj_l and on |w| after proj_w (distances: stage ->
    [SA layers, heads]) with the level of uniform attention, beside each CA head's entropy (nats; uniform =
    ln N; entropy [CA layers, heads])."""
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.62, 0.38],
        subplot_titles=("Mean attention distance per SA head", "Entropy of each CA head's map"),
    )
    _add_distances(fig, distances, uniform_distance)
    _add_entropies(fig, entropy, patches)
    layers = next(iter(distances.values())).shape[0]
    fig.update_xaxes(title_text="SA layer", dtick=1 if layers <= 24 else 4, row=1, col=1)
    fig.update_yaxes(title_text="pixels", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="head", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="nats", rangemode="tozero", row=1, col=2)
    fig.update_layout(
        title="Per-head statistics of this image", barmode="group", template="plotly_white", **legend_below(460)
    )
    return fig


PICKER_SIDE = 320  # the talking-heads tab's clickable image of the patch grid


def query_picker(view: Image.Image, g: int, patch: int, side: int = PICKER_SIDE) -> Image.Image:
    """The model's view with its patch grid drawn and the query patch outlined: click a patch to query it."""
    image = display_base(view, side)
    draw, cell = ImageDraw.Draw(image), side / g
    for i in range(1, g):
        draw.line([(i * cell, 0), (i * cell, side)], fill=(255, 255, 255), width=1)
        draw.line([(0, i * cell), (side, i * cell)], fill=(255, 255, 255), width=1)
    r, c = divmod(patch, g)
    return draw_box(image, (c * cell, r * cell, (c + 1) * cell, (r + 1) * cell), 1.0)


def query_tiles(
    view: Image.Image,
    stages: dict[str, np.ndarray],
    patch: int,
    *,
    cmap: str = "inferno",
    alpha: float = 0.6,
    side: int = 160,
) -> list[tuple[Image.Image, str]]:
    """Where one query patch looks, per head, at each stage (stages: name -> [h, N, N]); the query patch
    is outlined. After proj_w the weights can be negative; each tile spans its own min .. max."""
    first = next(iter(stages.values()))
    g = int(round(first.shape[-1] ** 0.5))
    base = display_base(view, side)
    cell = side / g
    r, c = divmod(patch, g)
    box = (c * cell, r * cell, (c + 1) * cell, (r + 1) * cell)
    tiles = []
    for stage, attn in stages.items():
        heats = torch.from_numpy(np.ascontiguousarray(attn[:, patch].reshape(-1, g, g)))
        for head, image in enumerate(overlays(base, heats, cmap=cmap, alpha=alpha)):
            tiles.append((draw_box(image, box, 1.0), f"head {head + 1} · {STAGE_LABELS[stage]}"))
    return tiles


__all__ = [
    "COLORMAPS",
    "STAGE_LABELS",
    "TILE",
    "display_base",
    "draw_box",
    "enlarged_figure",
    "image_under",
    "head_stats_figure",
    "mixing_figure",
    "image_file",
    "query_picker",
    "query_tiles",
    "region_image",
    "saliency_bars",
    "saliency_tile",
    "save_tiles",
]
