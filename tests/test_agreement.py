"""cait.explain.agreement: Spearman's is scipy's (ties included), and the top-region numbers are counted by hand on
maps built to have them."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from cait.explain.agreement import map_agreement, spearman


def test_spearman_is_scipys_with_ties_and_none_on_a_flat_map():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.integers(0, 4, 25).astype(float), rng.normal(size=25)  # many ties in a
        assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    assert spearman(np.ones(9), np.arange(9)) is None and spearman([1.0, 2.0], [2.0, 1.0]) is None


def test_the_top_attention_regions_hold_the_restoration_they_hold():
    """Ten regions, the top one (10%) by attention is region 3; region 3 restores 2 of the 5 logits restored
    (negative restorations count for nothing), and the most-restoring region is 7, not 3."""
    attention = np.array([0.1, 0.0, 0.2, 0.9, 0.1, 0.0, 0.3, 0.4, 0.1, 0.0])
    restored = np.array([0.5, -1.0, 0.0, 2.0, 0.0, 0.0, 0.0, 2.5, -0.5, 0.0])
    got = map_agreement(attention, restored)
    assert (got.regions, got.top, got.chance) == (10, 1, 0.1)
    assert got.share_in_top == pytest.approx(2.0 / (0.5 + 2.0 + 2.5))
    assert got.overlap == 0.0  # region 7 restores most
    assert got.rank_correlation == pytest.approx(spearmanr(attention, restored).statistic)
    box = np.zeros(10, bool)
    box[[2, 3, 6, 7]] = True
    got = map_agreement(attention, restored, top_share=0.2, box=box)
    assert got.top == 2 and got.overlap == 1.0  # regions 3 and 7 lead both maps
    assert got.rank_in_box == pytest.approx(spearmanr(attention[box], restored[box]).statistic)
    assert map_agreement(attention, -np.abs(restored)).share_in_top is None  # nothing restored
