"""Subset-stable scenes: scene i is the same frame, garment and pixels in every subset of a split, and the whole
split keeps the layout it always had (the scenes the shipped models were scored on)."""

import numpy as np
import pytest

from cait.data import FashionMNISTScenes
from cait.data.fashion_mnist import load_fashion_mnist
from cait.data.scene_cache import cache_path


def _whole_split_layout(split: str, seed: int, canvas: int = 64) -> tuple[np.ndarray, ...]:
    """(sides, x0, y0) as generator versions 1 and 2 drew them for a whole split: one stream per (seed, split),
    the frames' sides (30-65% of the canvas), then their left and top edges, each one vector over all scenes."""
    total = len(load_fashion_mnist(split)[1])
    rng = np.random.default_rng([seed, {"train": 0, "val": 1}[split], 0])
    sides = np.round(rng.uniform(0.30, 0.65, total) * canvas).astype(int)
    x0 = np.floor(rng.uniform(0, 1, total) * (canvas - sides + 1)).astype(int)
    y0 = np.floor(rng.uniform(0, 1, total) * (canvas - sides + 1)).astype(int)
    return sides, x0, y0


@pytest.mark.parametrize(("split", "seed"), [("val", 0), ("train", 3)])
def test_the_whole_split_keeps_its_layout(split, seed):
    scenes = FashionMNISTScenes(split, seed=seed)
    for ours, reference in zip((scenes.sides, scenes.x0, scenes.y0), _whole_split_layout(split, seed)):
        np.testing.assert_array_equal(ours, reference)


@pytest.mark.parametrize(
    ("split", "seed", "look"),
    [("val", 0, {}), ("val", 0, {"style": "varied"}), ("val", 0, {"pixel_noise": 0.08}), ("train", 3, {})],
)
def test_a_subset_is_the_whole_splits_first_scenes(split, seed, look):
    whole = FashionMNISTScenes(split, seed=seed, **look)
    for n in (1, 37, 300):
        subset = FashionMNISTScenes(split, seed=seed, subset=n, **look)
        assert len(subset) == n
        for name in ("sides", "x0", "y0", "boxes", "labels"):
            np.testing.assert_array_equal(getattr(subset, name), getattr(whole, name)[:n], err_msg=name)
        for i in sorted({0, n // 2, n - 1}):  # the pixels too: clutter, colours and the varied look are per scene
            np.testing.assert_array_equal(subset.render(i), whole.render(i), err_msg=f"n={n}, scene {i}")


def test_a_subsets_cache_file_holds_the_whole_splits_scenes(monkeypatch, tmp_path):
    monkeypatch.setenv("CAIT_LENS_CACHE", str(tmp_path))
    n = 24
    subset, whole = FashionMNISTScenes("val", subset=n, cache=True), FashionMNISTScenes("val")
    np.testing.assert_array_equal(subset.pixels, np.stack([whole.render(i) for i in range(n)]))
    # a version-2 file of a subset holds the layout drawn for its n scenes alone: it is never read again
    path = cache_path(subset)
    monkeypatch.setattr(FashionMNISTScenes, "GENERATOR_VERSION", 2)
    assert cache_path(subset) != path
