"""Which class-attention head of model A works like which head of model B: per image, the Spearman rank
correlation of the two heads' maps on the image's pixels (each pixel takes the weight of the patch it lies in, so
models with different grids or image sizes compare; ties get their average rank), averaged over the images;
then a one-to-one matching of the heads that maximises the summed similarity (the Hungarian method)."""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from .options import Head


def head_labels(layers: int, heads: int) -> list[Head]:
    """The (layer, head) of every CA head in row-major order, numbered from 1."""
    return [(layer + 1, head + 1) for layer in range(layers) for head in range(heads)]


def _axis_cells(grid_a: int, grid_b: int, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Along one axis of a `size`-pixel image: the runs of pixels that lie in the same patch of both grids (pixel x
    lies in patch x * grid // size), as (patch of A, patch of B, pixels) per run."""
    x = torch.arange(size)
    pairs, counts = torch.unique(torch.stack([x * grid_a // size, x * grid_b // size], 1), dim=0, return_counts=True)
    return pairs[:, 0], pairs[:, 1], counts


def common_cells(grid_a: int, grid_b: int, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cells of a size x size image in which both grids' patches are constant: per cell the flat patch index of
    A and of B and its area in pixels [C] each. A rank over these cells weighted by area is the rank over pixels."""
    ra, rb, rows = _axis_cells(grid_a, grid_b, size)
    return (
        (ra[:, None] * grid_a + ra[None, :]).flatten(),
        (rb[:, None] * grid_b + rb[None, :]).flatten(),
        (rows[:, None] * rows[None, :]).flatten().double(),
    )


def weighted_average_ranks(values: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Ranks along the last dimension of values that each stand for `weight` [C] tied pixels: the mean of the
    pixel ranks (from 1) each value's pixels span among all, ties across values included."""
    order = values.argsort(-1)
    ordered = values.gather(-1, order).contiguous()
    cumulative = torch.cat([weight.new_zeros(*values.shape[:-1], 1), weight[order].cumsum(-1)], -1)
    below = cumulative.gather(-1, torch.searchsorted(ordered, values.contiguous(), right=False))
    upto = cumulative.gather(-1, torch.searchsorted(ordered, values.contiguous(), right=True))
    return (below + upto + 1) / 2


def _standardised(ranks: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Weighted ranks centred and scaled so that a weighted dot product of two is their Pearson correlation."""
    centred = (ranks - (ranks * weight).sum(-1, keepdim=True) / weight.sum()) * weight.sqrt()
    norm = centred.norm(dim=-1, keepdim=True)
    return centred / torch.where(norm > 1e-9, norm, torch.nan)  # a constant map has no ranking: NaN


def map_similarity(maps_a: torch.Tensor, maps_b: torch.Tensor, *, size: int) -> torch.Tensor:
    """Per image the Spearman correlation of every head of A with every head of B on size x size pixels, each
    pixel taking the weight of the patch of its map it lies in: maps_a [B, La, Ha, ga, ga], maps_b [B, Lb, Hb, gb,
    gb] -> [B, La * Ha, Lb * Hb] (NaN where a map is flat). Computed exactly on the cells where both grids'
    patches are constant, weighted by their pixels, not on every pixel (about 35 times fewer values for grids 17
    and 7 on 136 pixels)."""
    index_a, index_b, weight = common_cells(maps_a.shape[-1], maps_b.shape[-1], size)
    za = _standardised(weighted_average_ranks(maps_a.double().flatten(-2)[..., index_a].flatten(1, 2), weight), weight)
    zb = _standardised(weighted_average_ranks(maps_b.double().flatten(-2)[..., index_b].flatten(1, 2), weight), weight)
    return za @ zb.transpose(1, 2)


def match_heads(similarity: np.ndarray) -> list[tuple[int, int, float]]:
    """The one-to-one pairing of A's heads (rows) with B's (columns) of the largest summed similarity, by the
    Hungarian method: (row, column, similarity) per pair, best first; min(rows, columns) pairs, NaN counted
    as no similarity."""
    score = np.nan_to_num(similarity, nan=-1.0)
    rows, cols = linear_sum_assignment(score, maximize=True)
    pairs = [(int(r), int(c), float(similarity[r, c])) for r, c in zip(rows, cols)]
    return sorted(pairs, key=lambda p: -np.nan_to_num(p[2], nan=-2.0))
