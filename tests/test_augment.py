"""Augmentation on batched uint8 tensors: a function of each image's seed only, the eval transform when
every random part is off, each part doing what it says, clear errors."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image

import cait
from cait.data import FashionMNIST, FashionMNISTScenes
from cait.preprocess import eval_transform
from cait.train.augment import BatchAugment, parse_randaug

HALF = dict(mean=(0.5,) * 3, std=(0.5,) * 3)
ALL_ON = dict(crop_scale=(0.25, 1.0), hflip=0.5, color_jitter=0.4, reprob=0.5)


@pytest.fixture(scope="module")
def scenes() -> torch.Tensor:
    return torch.from_numpy(FashionMNISTScenes("val", subset=12, cache=True).pixels[:12].copy())


@pytest.mark.parametrize("options", [ALL_ON, dict(ALL_ON, randaug="rand-m9-mstd0.5-inc1")], ids=["jitter", "randaug"])
def test_each_image_is_a_function_of_its_seed_only(scenes, options):
    aug = BatchAugment(img_size=64, in_chans=3, **HALF, **options)
    seeds = [101 + 7 * k for k in range(len(scenes))]
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    out = aug(scenes, seeds)
    # the caller's RNGs are untouched: the training loop's mixup / drop path draws do not shift
    assert torch.equal(states[0], torch.get_rng_state()) and states[1] == random.getstate()
    assert np.array_equal(states[2], np.random.get_state()[1])
    assert torch.equal(out, aug(scenes, seeds))
    # not its batch, nor its place in it
    assert torch.equal(out[3:6], aug(scenes[3:6], seeds[3:6]))
    assert torch.equal(out[[5, 2]], aug(scenes[[5, 2]], [seeds[5], seeds[2]]))
    other = aug(scenes, [s + 1 for s in seeds])
    assert all(not torch.equal(out[k], other[k]) for k in range(len(scenes)))


def test_with_every_random_part_off_it_is_the_eval_transform(scenes):
    plain = dict(crop_scale=(1.0, 1.0), hflip=0.0)
    rgb = cait.get_config("cait_nano_64")
    out = BatchAugment(img_size=64, in_chans=3, mean=rgb.mean, std=rgb.std, **plain)(scenes, range(len(scenes)))
    want = torch.stack([eval_transform(rgb)(Image.fromarray(im.numpy())) for im in scenes])
    assert torch.allclose(out, want, atol=1e-6)
    flipped = BatchAugment(img_size=64, in_chans=3, mean=rgb.mean, std=rgb.std, crop_scale=(1.0, 1.0), hflip=1.0)
    assert torch.allclose(flipped(scenes, range(len(scenes))), want.flip(-1), atol=1e-6)
    # RGB scenes into a grey model: PIL's convert("L") (which rounds to uint8, hence 1/255)
    grey = rgb.replace(in_chans=1, mean=(0.5,), std=(0.5,))
    out = BatchAugment(img_size=64, in_chans=1, mean=grey.mean, std=grey.std, **plain)(scenes, range(len(scenes)))
    want = torch.stack([eval_transform(grey)(Image.fromarray(im.numpy())) for im in scenes])
    assert out.shape == (12, 1, 64, 64) and (out - want).abs().max() <= 2 / 255 / 0.5 + 1e-6


def test_shapes_and_ranges_for_any_data_and_model_size():
    garments = torch.from_numpy(FashionMNIST("val", subset=8).pixels.copy())  # uint8 [8, 28, 28, 1]
    for chans in (1, 3):
        aug = BatchAugment(
            img_size=32,
            in_chans=chans,
            mean=(0.5,) * chans,
            std=(0.25,) * chans,
            crop_scale=(0.25, 1.0),
            color_jitter=0.4,
        )
        out = aug(garments, range(8))
        assert out.shape == (8, chans, 32, 32) and out.dtype == torch.float32
        assert out.min() >= (0 - 0.5) / 0.25 - 1e-5 and out.max() <= (1 - 0.5) / 0.25 + 1e-5
        assert out.std() > 0.1  # a picture, not a constant


def test_flip_jitter_and_erasing_do_what_they_say(scenes):
    seeds = list(range(len(scenes)))
    base = BatchAugment(img_size=64, in_chans=3, **HALF, crop_scale=(1.0, 1.0), hflip=0.0)
    ref = base(scenes, seeds)
    # jitter: other pixel values, same picture (strongly correlated), still in range
    jit = BatchAugment(img_size=64, in_chans=3, **HALF, crop_scale=(1.0, 1.0), hflip=0.0, color_jitter=0.4)(
        scenes, seeds
    )
    assert not torch.equal(jit, ref) and jit.min() >= -1 and jit.max() <= 1
    corr = [np.corrcoef(a.flatten(), b.flatten())[0, 1] for a, b in zip(ref, jit)]
    assert min(corr) > 0.5
    # RandAugment replaces jitter (as in timm): the jitter strength changes nothing then
    ra = dict(crop_scale=(1.0, 1.0), hflip=0.0, randaug="rand-m9")
    assert torch.equal(
        BatchAugment(img_size=64, in_chans=3, **HALF, **ra)(scenes, seeds),
        BatchAugment(img_size=64, in_chans=3, **HALF, **ra, color_jitter=0.4)(scenes, seeds),
    )
    # erasing: every image gets one rectangle of noise, the rest untouched
    erased = BatchAugment(img_size=64, in_chans=3, **HALF, crop_scale=(1.0, 1.0), hflip=0.0, reprob=1.0)(scenes, seeds)
    for k in range(len(scenes)):
        changed = (erased[k] != ref[k]).any(0)
        rows, cols = changed.nonzero().T
        assert 0.02 * 64 * 64 * 0.5 <= changed.sum() <= 64 * 64 / 3 + 64
        box = changed[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
        assert box.float().mean() > 0.95  # a rectangle


def test_crop_scale_bounds_the_zoom(scenes):
    # a crop covering at most 30% of the area is visibly zoomed in: far from the unaugmented image
    seeds = list(range(len(scenes)))
    base = BatchAugment(img_size=64, in_chans=3, **HALF, crop_scale=(1.0, 1.0), hflip=0.0)(scenes, seeds)
    zoom = BatchAugment(img_size=64, in_chans=3, **HALF, crop_scale=(0.25, 0.3), hflip=0.0)(scenes, seeds)
    assert all((a - b).abs().mean() > 0.05 for a, b in zip(base, zoom))


def test_bad_inputs_are_clear():
    assert parse_randaug("none") is None and parse_randaug("rand-m9-mstd0.5-inc1") == (2, 9)
    assert parse_randaug("rand-n3-m5") == (3, 5)
    for bad, match in (
        ("autoaug", "timm RandAugment string"),
        ("rand-mstd0.5", "timm RandAugment string"),
        ("rand-m12", "0..10"),
    ):
        with pytest.raises(ValueError, match=match):
            parse_randaug(bad)
    aug = BatchAugment(img_size=32, in_chans=3, **HALF)
    with pytest.raises(ValueError, match="uint8"):
        aug(torch.zeros(2, 32, 32, 3), [0, 1])
    with pytest.raises(ValueError):  # one seed per image
        aug(torch.zeros(2, 32, 32, 3, dtype=torch.uint8), [0])
