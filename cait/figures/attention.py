"""The class-attention grid: for each CA layer its head mean (first, so it stays in the same place for
any head count) and every head, overlaid on what the model sees, captioned with layer, head (both
numbered from 1) and the class token's attention to itself. The app shows the tiles in a gallery per
layer; `tile_sheet` draws the same tiles as one PNG (the app's download, the analysis figure)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from ..explain.maps import overlays, regions_of_focus

TILE = 224  # display side of one tile (the model's own input may be 28-448 px)
CAPTION_H = 20  # caption strip above each tile of a sheet
MAX_COLUMNS = 9  # tiles per row before a layer's row wraps: 9 tiles of ~130 px fit a 1280 px page


@dataclass
class Tile:
    image: Image.Image
    caption: str
    layer: int  # CA layer, 0-based
    head: int | None  # head, 0-based; None for the head mean
    self_share: float  # the class token's attention to itself (not drawn: maps and self share sum to 1)

    @property
    def short_caption(self) -> str:
        """The caption without the layer, for a gallery that is already one layer's."""
        return self.caption.split(" ", 1)[1]


def head_name(layer: int, head: int | None) -> str:
    """'CA1 head 3' / 'CA2 mean' (numbered from 1, as everywhere the app and figures show them)."""
    return f"CA{layer + 1} " + ("mean" if head is None else f"head {head + 1}")


def display_base(view: Image.Image, side: int = TILE) -> Image.Image:
    """The model's input crop enlarged for display (nearest: a small input stays crisp, not blurred)."""
    return view.convert("RGB").resize((side, side), Image.Resampling.NEAREST)


def attention_tile(
    base: Image.Image,
    maps: np.ndarray,
    self_share: np.ndarray,
    layer: int,
    head: int | None,
    *,
    cmap: str = "inferno",
    alpha: float = 0.5,
    shared_scale: bool = False,
    smooth: bool = True,
    keep_mass: float = 1.0,
) -> Tile:
    """One tile of `attention_tiles` (head None: the head mean), drawn on `base` at its size. keep_mass < 1
    dims every patch outside the smallest set holding that share of the map's mass (the paper's Fig. 7
    rule, `cait.explain.maps.regions_of_focus`) and says how many patches that set has."""
    return _tiles(
        base,
        maps,
        self_share,
        [(layer, head)],
        cmap=cmap,
        alpha=alpha,
        shared_scale=shared_scale,
        smooth=smooth,
        keep_mass=keep_mass,
    )[0]


def _tiles(
    base: Image.Image,
    maps: np.ndarray,
    self_share: np.ndarray,
    which: list[tuple[int, int | None]],
    *,
    cmap: str,
    alpha: float,
    shared_scale: bool,
    smooth: bool,
    keep_mass: float,
) -> list[Tile]:
    """`attention_tile` for each (layer, head) of `which`, their overlays drawn in one call."""
    heats = np.stack([maps[layer].mean(0) if head is None else maps[layer, head] for layer, head in which])
    ranges = [(0.0, float(maps[layer].max())) if shared_scale else None for layer, _ in which]
    images = overlays(base, torch.from_numpy(heats), cmap=cmap, alpha=alpha, value_ranges=ranges, smooth=smooth)
    tiles = []
    for (layer, head), heat, image in zip(which, heats, images):
        share = float(self_share[layer].mean() if head is None else self_share[layer, head])
        caption = f"{head_name(layer, head)} · self {share:.0%}"
        if keep_mass < 1.0:
            mask, _ = regions_of_focus(torch.from_numpy(heat)[None], keep_mass, img_size=heat.shape[-1])
            keep = (
                np.asarray(Image.fromarray(mask[0].numpy().astype(np.uint8) * 255).resize(image.size, Image.NEAREST))
                > 0
            )
            pixels = np.asarray(image)
            image = Image.fromarray(np.where(keep[..., None], pixels, pixels // 3))
            caption += f" · {int(mask.sum())} patches"
        tiles.append(Tile(image, caption, layer, head, share))
    return tiles


def attention_tiles(
    view: Image.Image, maps: np.ndarray, self_share: np.ndarray, *, side: int = TILE, **look
) -> list[list[Tile]]:
    """maps [L, heads, g, g], self_share [L, heads] -> per CA layer [mean, head 1, ..., head H].

    look: `attention_tile`'s colormap, opacity, smooth or patch-grid view, and shared_scale: every tile of
    a layer maps 0 .. the layer's largest value to the colormap, so tiles compare; otherwise each tile
    spans its own min .. max (shows the shape of weak heads too)."""
    look = {"cmap": "inferno", "alpha": 0.5, "shared_scale": False, "smooth": True, "keep_mass": 1.0, **look}
    heads = (None, *range(maps.shape[1]))
    tiles = _tiles(
        display_base(view, side),
        maps,
        self_share,
        [(layer, head) for layer in range(maps.shape[0]) for head in heads],
        **look,
    )
    return [tiles[i : i + len(heads)] for i in range(0, len(tiles), len(heads))]


def grid_columns(tiles_per_layer: int, max_columns: int = MAX_COLUMNS) -> int:
    """Columns for one layer's tiles: all in one row when they fit, else rows of equal length
    (17 tiles of a 16-head model: 2 rows of 9)."""
    rows = -(-tiles_per_layer // max_columns)
    return -(-tiles_per_layer // rows)


def load_font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:  # no DejaVu on this machine: Pillow's own font
        return ImageFont.load_default(size=size)


def colour_bar(cmap: str, low: str, high: str, *, width: int = 320, height: int = 14) -> Image.Image:
    """A horizontal colormap strip with its two end labels underneath."""
    import matplotlib

    ramp = matplotlib.colormaps[cmap](np.linspace(0, 1, width))[None, :, :3]
    strip = Image.fromarray((np.repeat(ramp, height, axis=0) * 255).astype(np.uint8))
    bar = Image.new("RGB", (width, height + 18), "white")
    bar.paste(strip, (0, 0))
    draw, font = ImageDraw.Draw(bar), load_font(12)
    draw.text((0, height + 2), low, fill="black", font=font)
    draw.text((width - draw.textlength(high, font=font), height + 2), high, fill="black", font=font)
    return bar


def tile_sheet(
    layers: list[list[Tile]], *, title: str = "", footer: Image.Image | None = None, max_columns: int = MAX_COLUMNS
) -> Image.Image:
    """The tiles as one image: each layer's tiles in rows of `grid_columns`, a caption over each tile,
    an optional title line on top and an optional footer (e.g. a `colour_bar`) at the bottom."""
    side = layers[0][0].image.width
    columns = grid_columns(len(layers[0]), max_columns)
    rows = sum(-(-len(tiles) // columns) for tiles in layers)
    top = CAPTION_H + 6 if title else 0
    extra = footer.height + 8 if footer is not None else 0
    sheet = Image.new("RGB", (columns * side, top + rows * (side + CAPTION_H) + extra), "white")
    draw, font = ImageDraw.Draw(sheet), load_font(13)
    if title:
        draw.text((6, 4), title, fill="black", font=load_font(14))
    y = top
    for tiles in layers:
        for i, tile in enumerate(tiles):
            x, row_y = (i % columns) * side, y + (i // columns) * (side + CAPTION_H)
            draw.text((x + 4, row_y + 3), tile.caption, fill="black", font=font)
            sheet.paste(tile.image, (x, row_y + CAPTION_H))
        y += -(-len(tiles) // columns) * (side + CAPTION_H)
    if footer is not None:
        sheet.paste(footer, (6, y + 4))
    return sheet
