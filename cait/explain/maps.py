"""Patch-grid heat maps to pixels: upsampling, colour overlays and the paper's regions of focus."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ._checks import ExplainInputError

# Regions of focus keep the smallest set of patches holding half of the CA-layer-1 mass: enough to
# outline the object on a trained model, small enough that a diffuse (untrained) map gives a big box.
DEFAULT_SHARE = 0.5


def size_pair(size: int | tuple[int, int]) -> tuple[int, int]:
    """An image size as (height, width): one int for a square, or a pair."""
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def upsample(heat: torch.Tensor, size: int | tuple[int, int]) -> torch.Tensor:
    """[..., g, g] -> [..., H, W] by bilinear interpolation with align_corners=False: each patch value
    sits at its patch centre, pixels between centres blend linearly, and the outer half patch is flat."""
    lead = heat.shape[:-2]
    flat = heat.reshape(-1, 1, *heat.shape[-2:]).float()
    out = F.interpolate(flat, size=size_pair(size), mode="bilinear", align_corners=False)
    return out.reshape(*lead, *out.shape[-2:])


def overlay(
    image: Image.Image,
    heat_2d: torch.Tensor,
    *,
    cmap: str = "inferno",
    alpha: float = 0.5,
    value_range: tuple[float, float] | None = None,
    smooth: bool = True,
) -> Image.Image:
    """`image` blended with the colour-mapped heat map, upsampled to the image size; alpha is the opacity
    of the heat layer (0 = image only, 1 = heat only).

    value_range: the values mapped to the two ends of the colormap (e.g. one range for every head of a
        layer, so that tiles compare); default the map's own min and max. Values outside are clipped.
    smooth: bilinear upsampling (`upsample`); False shows the patch grid as it is, one flat block per patch.
    """
    if heat_2d.dim() != 2:
        raise ExplainInputError(f"overlay takes one 2-D heat map, got shape {list(heat_2d.shape)}")
    return overlays(
        image,
        heat_2d[None],
        cmap=cmap,
        alpha=alpha,
        smooth=smooth,
        value_ranges=None if value_range is None else [value_range],
    )[0]


def overlays(
    image: Image.Image,
    heats: torch.Tensor,
    *,
    cmap: str = "inferno",
    alpha: float = 0.5,
    value_ranges: list[tuple[float, float] | None] | None = None,
    smooth: bool = True,
) -> list[Image.Image]:
    """`overlay` of each map of heats [T, g, g] on the same image (value_ranges: one per map, None for
    the map's own min .. max), upsampled in one call; the pixels are `overlay`'s, only computed faster:
    the colour index (as matplotlib's colormap quantises it) and the base pixel select the blended byte
    from a table made once with the blend's own arithmetic (`_blend_table`)."""
    if heats.dim() != 3:
        raise ExplainInputError(f"overlays takes heat maps [T, g, g], got shape {list(heats.shape)}")
    if not 0.0 <= alpha <= 1.0:
        raise ExplainInputError(f"alpha must be in [0, 1], got {alpha}")
    base = np.asarray(image.convert("RGB"))
    size = base.shape[:2]
    heats = heats.detach().cpu().float()
    up = upsample(heats, size) if smooth else F.interpolate(heats[:, None], size=size, mode="nearest")[:, 0]
    table = _blend_table(cmap, float(alpha))
    colours = table.shape[2] - 1  # the colormap's entries; the last one is its "bad" (NaN) colour
    # numpy from here (one thread, faster than torch's pool); int32 offsets into the flat table, the base
    # pixel's part computed once for every map
    base_offset = base.astype(np.int32) * table.shape[2] + np.arange(3, dtype=np.int32) * table[0].size
    ranges = value_ranges or [None] * len(up)
    index = np.stack(
        [_colour_index(_unit(heat, value_range), colours) for heat, value_range in zip(up.numpy(), ranges)]
    )
    pixels = table.reshape(-1)[base_offset + index[..., None]]
    return [Image.fromarray(tile) for tile in pixels]


def _unit(heat: np.ndarray, value_range: tuple[float, float] | None) -> np.ndarray:
    """heat mapped to [0, 1] from value_range (default its own min .. max), clipped; a flat map is all 0."""
    lo, hi = value_range or (float(heat.min()), float(heat.max()))
    return np.clip((heat - lo) / (hi - lo), 0, 1) if hi > lo else np.zeros_like(heat)


def _colour_index(heat: np.ndarray, colours: int) -> np.ndarray:
    # matplotlib's Colormap.__call__ on floats in [0, 1]: x * N truncated, 1.0 in the top colour; NaN
    # (a "bad" value) gets index N, the extra last entry of `_blend_table`.
    scaled = heat * colours
    bad = np.isnan(scaled)
    index = np.minimum(np.where(bad, 0, scaled).astype(np.int32), colours - 1)
    index[bad] = colours
    return index


@lru_cache(maxsize=32)
def _blend_table(cmap: str, alpha: float) -> np.ndarray:
    """[3 channels, 256 base bytes, N + 1 colours] uint8: the blended byte for each base byte and colour
    index of the colormap (N entries, then its colour for NaN), computed by the straightforward float
    formula on every pair, so that looking a pixel up gives that formula's byte."""
    import matplotlib

    colormap = matplotlib.colormaps[cmap]
    lut = np.concatenate([colormap(np.arange(colormap.N)), colormap(np.array([np.nan]))])[:, :3]  # float64
    base = np.arange(256, dtype=np.float32)
    blended = (1 - alpha) * base[:, None, None] / 255 + alpha * lut[None]  # [256, N + 1, 3] float64
    table = (blended.clip(0, 1) * 255).round().astype(np.uint8)
    return np.ascontiguousarray(table.transpose(2, 0, 1))


def mask_to_boxes(mask: torch.Tensor, img_size: int | tuple[int, int]) -> torch.Tensor:
    """Bounding boxes [B, 4] (x0, y0, x1, y1, input pixels) of the True patches of mask [B, g, g];
    an empty mask gives the whole image."""
    H, W = size_pair(img_size)
    B, g, _ = mask.shape
    rows, cols = mask.any(dim=2), mask.any(dim=1)  # [B, g] occupied grid rows / columns
    idx = torch.arange(g, device=mask.device)
    first = lambda occupied: torch.where(occupied, idx, g).min(dim=1).values
    last = lambda occupied: torch.where(occupied, idx, -1).max(dim=1).values
    empty = ~mask.flatten(1).any(dim=1)
    x0, x1 = first(cols).masked_fill(empty, 0), (last(cols) + 1).masked_fill(empty, g)
    y0, y1 = first(rows).masked_fill(empty, 0), (last(rows) + 1).masked_fill(empty, g)
    return torch.stack((x0 * W / g, y0 * H / g, x1 * W / g, y1 * H / g), dim=1).float()


def regions_of_focus(
    heat: torch.Tensor, share: float = DEFAULT_SHARE, *, img_size: int | tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paper Fig. 7 style regions: the smallest set of patches holding `share` of the map's mass
    (negative values count as 0), as a mask [B, g, g] and its bounding box [B, 4] in input pixels.

    heat: [B, g, g], usually `class_attention(model, x).mean[:, 0]` (CA layer 1, head mean).
    img_size: the model's input side in pixels (`model.cfg.img_size`): a patch grid alone does not know
        its pixel size, so the boxes need it.
    """
    if not 0.0 < share <= 1.0:
        raise ExplainInputError(f"share must be in (0, 1], got {share}")
    if heat.dim() != 3:
        raise ExplainInputError(f"heat must be [B, g, g], got shape {list(heat.shape)}")
    B, g, _ = heat.shape
    mass = heat.detach().flatten(1).clamp_min(0).float()
    order = mass.argsort(dim=1, descending=True)
    cumulative = mass.gather(1, order).cumsum(dim=1)
    total = cumulative[:, -1:].clamp_min(1e-12)
    # number of top patches needed: first position where the running share reaches `share`
    keep = (cumulative / total < share - 1e-6).sum(dim=1, keepdim=True) + 1
    ranks = torch.empty_like(order).scatter_(1, order, torch.arange(g * g, device=heat.device).expand(B, -1))
    mask = (ranks < keep).reshape(B, g, g)
    return mask, mask_to_boxes(mask, img_size)
