"""Rendered scenes pinned bit for bit: pixels, boxes and labels of a few scenes of whole splits and of a subset's
cache file, against sha256 digests committed here (computed at generator version 3), not re-derived by the code's own
algorithm. A renderer change that moves any pixel or box of the default or varied style fails here."""

import hashlib

import numpy as np
import pytest

from cait.data import FashionMNISTScenes


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


# (split, seed, style) -> {scene index: (pixels digest, box digest)}
WHOLE_SPLIT = {
    ("val", 0, "default"): {
        0: ("df4c18bbe395a23d", "06839e91712f058e"),
        1: ("9606af0bda759059", "4823e64693db6a39"),
        5000: ("ec6bf3c0a0a7589c", "b60616815de916eb"),
        9999: ("3884e47537b58fa1", "034805be8e73d043"),
    },
    ("val", 0, "varied"): {
        0: ("8c2d36f1dd21c74d", "06839e91712f058e"),
        5000: ("76082d145f6ecd34", "b60616815de916eb"),
        9999: ("77bb872386932438", "034805be8e73d043"),
    },
    ("train", 0, "default"): {
        0: ("21e58066188151b8", "6984754ec1530f0e"),
        30000: ("e3e53aea82eb1489", "b6ecd1b2e4598034"),
        59999: ("05e4bcda0277134b", "5db3cb03541d12ab"),
    },
}
# (split, seed, style) -> digests of a 12-scene subset's cached pixels, boxes and labels
SUBSET_12 = {
    ("val", 0, "default"): ("ddb86b8bd21a875f", "7cac92c0735d6b14", "c85bc1cc8fec5bc8"),
    ("val", 0, "varied"): ("9b007d269474e4b8", "7cac92c0735d6b14", "c85bc1cc8fec5bc8"),
    ("train", 0, "default"): ("ee35f65979ffcf1a", "332499365d1985fa", "d779d100bfa3f9e7"),
}


@pytest.mark.parametrize("key", list(WHOLE_SPLIT), ids=lambda k: "-".join(map(str, k)))
def test_whole_split_scenes_are_pinned(key):
    split, seed, style = key
    scenes = FashionMNISTScenes(split, seed=seed, style=style)
    for i, (pixels, box) in WHOLE_SPLIT[key].items():
        assert (_digest(scenes.render(i)), _digest(scenes.boxes[i])) == (pixels, box), (key, i)


@pytest.mark.parametrize("key", list(SUBSET_12), ids=lambda k: "-".join(map(str, k)))
def test_a_subsets_cached_scenes_are_pinned(key, monkeypatch, tmp_path):
    monkeypatch.setenv("CAIT_LENS_CACHE", str(tmp_path))
    split, seed, style = key
    scenes = FashionMNISTScenes(split, seed=seed, style=style, subset=12, cache=True)
    assert (_digest(scenes.pixels), _digest(scenes.boxes), _digest(scenes.labels)) == SUBSET_12[key]
