"""cait.compare's numbers against independent references: the minibatch CKA against torch-cka (the reference
package) and Kornblith et al.'s unbiased centering written out here, the linear CKA closed form on random
matrices; the pixel Spearman against scipy; the matching against a brute force; McNemar against its binomial."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import binom, spearmanr
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from cait.compare.cka import HSICSums, minibatch_sums
from cait.compare.heads import map_similarity, match_heads
from cait.compare.stats import mcnemar_exact


def _features(seed: int, n: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 'models' of 3 and 2 blocks (widths 12 and 7) whose representations share a signal."""
    g = torch.Generator().manual_seed(seed)
    signal = torch.randn(n, 5, generator=g)
    a = torch.stack([signal @ torch.randn(5, 12, generator=g) + k * torch.randn(n, 12, generator=g) for k in range(3)])
    b = torch.stack([signal @ torch.randn(5, 7, generator=g) + 2 * k * torch.randn(n, 7, generator=g) for k in (0, 1)])
    return a, b


def _minibatch_cka(a: torch.Tensor, b: torch.Tensor, batch: int) -> np.ndarray:
    sums = HSICSums.zeros(len(a), len(b))
    for start in range(0, a.shape[1], batch):
        sums = sums + minibatch_sums(a[:, start : start + batch], b[:, start : start + batch])
    return sums.cka()


def _unbiased_centred(gram: np.ndarray) -> np.ndarray:
    """Kornblith et al. 2019's unbiased centering of a Gram matrix (U-centering, Szekely and Rizzo 2014)."""
    n = len(gram)
    gram = gram.copy()
    np.fill_diagonal(gram, 0)
    means = gram.sum(0) / (n - 2)
    means -= means.sum() / (2 * (n - 1))
    gram = gram - means[:, None] - means[None, :]
    np.fill_diagonal(gram, 0)
    return gram


def test_one_minibatch_is_debiased_cka_by_u_centering():
    a, b = _features(0, n=40)
    ours = _minibatch_cka(a, b, batch=40)
    for i, j in itertools.product(range(3), range(2)):
        x, y = a[i].double().numpy(), b[j].double().numpy()
        k, l = _unbiased_centred(x @ x.T), _unbiased_centred(y @ y.T)
        want = (k * l).sum() / np.sqrt((k * k).sum() * (l * l).sum())
        assert ours[i, j] == pytest.approx(want, abs=1e-10)


def test_minibatch_cka_tends_to_the_linear_cka_closed_form():
    a, b = _features(1, n=4000)
    ours = _minibatch_cka(a, b, batch=500)
    for i, j in itertools.product(range(3), range(2)):
        x = a[i].double().numpy() - a[i].double().numpy().mean(0)
        y = b[j].double().numpy() - b[j].double().numpy().mean(0)
        closed = np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))
        assert ours[i, j] == pytest.approx(closed, abs=0.01)


class _Lookup(nn.Module):
    """A 'model' whose block k outputs the precomputed features of block k for the indices it is given."""

    def __init__(self, features: torch.Tensor):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Identity() for _ in features)
        self.features = features

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return torch.stack([blk(f[index]) for blk, f in zip(self.blocks, self.features)])


def test_minibatch_cka_equals_torch_cka():
    from torch_cka import CKA

    a, b = _features(2, n=96)
    loader = DataLoader(TensorDataset(torch.arange(96)), batch_size=32)
    layers = lambda f: [f"blocks.{k}" for k in range(len(f))]  # noqa: E731
    ref = CKA(_Lookup(a), _Lookup(b), "a", "b", model1_layers=layers(a), model2_layers=layers(b))
    ref.compare(loader, loader)
    assert np.allclose(_minibatch_cka(a, b, batch=32), ref.hsic_matrix.numpy(), atol=1e-4)


def test_cka_of_features_with_themselves_is_one_on_the_diagonal():
    a, _ = _features(3)
    assert np.allclose(np.diag(_minibatch_cka(a, a, batch=16)), 1, atol=1e-10)


def test_shard_sums_add_up_to_one_run():
    a, b = _features(4)
    whole = minibatch_sums(a[:, :48], b[:, :48]) + minibatch_sums(a[:, 48:], b[:, 48:])
    assert np.allclose(whole.cka(), _minibatch_cka(a, b, batch=48))
    assert minibatch_sums(a[:, :3], b[:, :3]).batches == 0  # under 4 images: nothing to add


def on_pixels(maps: torch.Tensor, size: int) -> np.ndarray:
    """Maps [B, L, H, g, g] spread over size x size pixels, each pixel x, y taking patch (y * g // size, x * g //
    size): [B, L * H, size * size]."""
    g = maps.shape[-1]
    patch = np.arange(size) * g // size
    return maps.numpy()[..., patch[:, None], patch[None, :]].reshape(maps.shape[0], -1, size * size)


def test_map_similarity_is_spearman_on_pixels_across_grids():
    g = torch.Generator().manual_seed(0)
    maps_a, maps_b = torch.rand(2, 1, 2, 4, 4, generator=g), torch.rand(2, 2, 1, 3, 3, generator=g)
    maps_a[1, 0, 1] = 0.5  # a flat map has no ranking
    maps_b[0, 1, 0, 2] = maps_b[0, 1, 0, 0]  # ties across patches
    ours = map_similarity(maps_a, maps_b, size=13).numpy()
    pa, pb = on_pixels(maps_a, 13), on_pixels(maps_b, 13)
    for i, ha, hb in itertools.product(range(2), range(2), range(2)):
        if i == 1 and ha == 1:
            assert np.isnan(ours[i, ha, hb])
        else:
            assert ours[i, ha, hb] == pytest.approx(spearmanr(pa[i, ha], pb[i, hb]).statistic, abs=1e-6)
    # on equal grids, pixels weigh each patch alike: the same as Spearman over patches
    same = map_similarity(maps_a[:1], maps_a[:1], size=16).numpy()
    patches = maps_a[0, 0].flatten(1).numpy()
    assert same[0, 0, 1] == pytest.approx(spearmanr(patches[0], patches[1]).statistic, abs=1e-6)


def test_matching_is_the_best_one_to_one_pairing():
    sim = np.random.default_rng(0).uniform(-1, 1, (4, 3))
    pairs = match_heads(sim)
    best = max(itertools.permutations(range(4), 3), key=lambda rows: sum(sim[r, c] for c, r in enumerate(rows)))
    assert {(r, c) for r, c, _ in pairs} == {(r, c) for c, r in enumerate(best)}
    assert [s for *_, s in pairs] == sorted((s for *_, s in pairs), reverse=True)


def test_mcnemar_exact_is_the_two_sided_binomial():
    want = min(1.0, 2 * binom.cdf(2, 12, 0.5))
    assert mcnemar_exact(2, 10) == pytest.approx(want)
    assert mcnemar_exact(0, 0) == 1.0
