"""Which class-attention head of model A works like which head of model B: per image, the Spearman rank
correlation of the two heads' maps on the image's pixels (each map spread over the pixels its patches cover, so
models with different grids or image sizes compare; ties get their average rank), averaged over the images;
then a one-to-one matching of the heads that maximises the summed similarity (the Hungarian method)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from .options import Head


def head_labels(layers: int, heads: int) -> list[Head]:
    """The (layer, head) of every CA head in row-major order, numbered from 1."""
    return [(layer + 1, head + 1) for layer in range(layers) for head in range(heads)]


def on_pixels(maps: torch.Tensor, size: int) -> torch.Tensor:
    """Maps [B, L, H, g, g] -> [B, L * H, size * size]: each pixel of a size x size image takes the weight of the
    patch it lies in (nearest), so a rank over pixels weighs a patch by its area."""
    B, L, H, g, _ = maps.shape
    flat = maps.float().reshape(B * L * H, 1, g, g)
    return F.interpolate(flat, size=(size, size), mode="nearest").reshape(B, L * H, size * size)


def average_ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks from 1 along the last dimension, ties given the mean of the ranks they span."""
    ordered = values.sort(-1).values.contiguous()
    below = torch.searchsorted(ordered, values.contiguous(), right=False)
    upto = torch.searchsorted(ordered, values.contiguous(), right=True)
    return (below + upto + 1).double() / 2


def _standardised(ranks: torch.Tensor) -> torch.Tensor:
    centred = ranks - ranks.mean(-1, keepdim=True)
    norm = centred.norm(dim=-1, keepdim=True)
    return centred / torch.where(norm > 0, norm, torch.nan)  # a constant map has no ranking: NaN


def map_similarity(maps_a: torch.Tensor, maps_b: torch.Tensor, *, size: int) -> torch.Tensor:
    """Per image the Spearman correlation of every head of A with every head of B on size x size pixels:
    maps_a [B, La, Ha, ga, ga], maps_b [B, Lb, Hb, gb, gb] -> [B, La * Ha, Lb * Hb] (NaN where a map is flat)."""
    za = _standardised(average_ranks(on_pixels(maps_a, size)))
    zb = _standardised(average_ranks(on_pixels(maps_b, size)))
    return za @ zb.transpose(1, 2)


def match_heads(similarity: np.ndarray) -> list[tuple[int, int, float]]:
    """The one-to-one pairing of A's heads (rows) with B's (columns) of the largest summed similarity, by the
    Hungarian method: (row, column, similarity) per pair, best first; min(rows, columns) pairs, NaN counted
    as no similarity."""
    score = np.nan_to_num(similarity, nan=-1.0)
    rows, cols = linear_sum_assignment(score, maximize=True)
    pairs = [(int(r), int(c), float(similarity[r, c])) for r, c in zip(rows, cols)]
    return sorted(pairs, key=lambda p: -np.nan_to_num(p[2], nan=-2.0))
