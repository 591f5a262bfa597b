"""How well an attention map predicts a patching map (token patching's restored logit per region): the share of
the restoration inside the top-attention regions, the overlap of the two maps' top regions, and the rank
correlation over all regions or within a box. A rank correlation over every region mixes the many regions that
matter to neither map with the few that matter; the top-region numbers say whether attention finds those few."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOP_SHARE = 0.1  # the top-attention regions: this share of the regions (at least one)


@dataclass(frozen=True)
class MapAgreement:
    """An attention map against a restoration map, over the same regions.

    Attributes:
        regions: the regions compared.
        top: the regions in the top-attention set (and in the restoration's top set for `overlap`).
        share_in_top: the share of the positive restoration inside the top-attention regions (None when no
            region restores anything); chance (a random set of `top` regions) is `top / regions` on average.
        overlap: the share of the restoration's `top` regions that are among attention's `top` regions.
        rank_correlation: Spearman's over every region (None when either map is flat).
        rank_in_box: Spearman's over the regions inside the box mask given (None without one, or when fewer than
            three regions, or a flat map, are inside).
    """

    regions: int
    top: int
    share_in_top: float | None
    overlap: float
    rank_correlation: float | None
    rank_in_box: float | None = None

    @property
    def chance(self) -> float:
        """`share_in_top` and `overlap` of a set of regions drawn at random, on average."""
        return self.top / self.regions


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 0, ties given their mean rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    _, tie, counts = np.unique(values, return_inverse=True, return_counts=True)
    return (np.bincount(tie, weights=ranks) / counts)[tie]


def spearman(first: np.ndarray, second: np.ndarray) -> float | None:
    """Spearman's rank correlation of two maps over their cells (ties ranked by their mean rank): Pearson's
    over the ranks. None when either map is flat or has fewer than three cells, which ranks nothing."""
    a, b = (np.asarray(m, dtype=np.float64).ravel() for m in (first, second))
    if a.size < 3 or a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(_ranks(a), _ranks(b))[0, 1])


def map_agreement(
    attention: np.ndarray, restored: np.ndarray, *, top_share: float = TOP_SHARE, box: np.ndarray | None = None
) -> MapAgreement:
    """How well `attention` predicts where `restored` is large, over the same regions.

    Args:
        attention: the attention per region (any shape; flattened).
        restored: the logit each region restores, the same shape (negative values restore nothing).
        top_share: the share of the regions taken as the top ones (at least one region).
        box: a boolean mask of the regions inside the object's box, the same shape, for `rank_in_box`.

    Returns:
        A `MapAgreement`.
    """
    a, r = (np.asarray(m, dtype=np.float64).ravel() for m in (attention, restored))
    if a.shape != r.shape:
        raise ValueError(f"attention {a.shape} and restored {r.shape} maps differ in shape")
    n = a.size
    k = min(n, max(1, round(top_share * n)))
    top_attention = np.argsort(-a, kind="stable")[:k]
    top_restored = np.argsort(-r, kind="stable")[:k]
    gained = np.clip(r, 0, None)
    share = float(gained[top_attention].sum() / gained.sum()) if gained.sum() > 0 else None
    inside = None
    if box is not None:
        mask = np.asarray(box, dtype=bool).ravel()
        inside = spearman(a[mask], r[mask])
    return MapAgreement(
        regions=n,
        top=k,
        share_in_top=share,
        overlap=len(set(top_attention.tolist()) & set(top_restored.tolist())) / k,
        rank_correlation=spearman(a, r),
        rank_in_box=inside,
    )
