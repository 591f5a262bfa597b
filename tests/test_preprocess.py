"""cait.preprocess: the model's view of an image is timm's evaluation transform, pixel for pixel."""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform

import cait
from cait import hub
from cait.preprocess import eval_transform

SIZES = [(300, 200), (200, 300), (137, 137), (1001, 333), (64, 64), (10, 700)]


def _timm_transform(cfg: cait.CaiTConfig):
    return create_transform(
        input_size=(cfg.in_chans, cfg.img_size, cfg.img_size),
        interpolation="bicubic",
        mean=cfg.mean,
        std=cfg.std,
        crop_pct=cfg.crop_pct,
    )


@pytest.mark.parametrize("crop_pct", [1.0, 0.875])
@pytest.mark.parametrize("variant", ["cait_pico_32", "cait_nano_28", "cait_micro_136", "cait_xxs24_224"])
def test_the_models_view_is_timms_eval_transform(variant, crop_pct):
    cfg = dataclasses.replace(cait.get_config(variant), crop_pct=crop_pct)
    ours, timms = eval_transform(cfg), _timm_transform(cfg)
    rng = np.random.default_rng(0)
    for w, h in SIZES:
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        expected = timms(image.convert("RGB" if cfg.in_chans == 3 else "L"))
        assert torch.equal(ours(image), expected), (variant, crop_pct, (w, h))


def test_the_app_imports_neither_torchvision_nor_dynamo_to_start():
    """torchvision's import pulls in torch._dynamo, and so did an arithmetic op on the meta device (the Model tab's
    weight sizes): each about a second of every app start, for nothing the page needs before an attribution
    method runs. (timm's sources are kept from the first start on, in the cache dir the process inherits.)"""
    hub.timm_sources()
    code = (
        "import sys, app.server, cait; from cait import hub; hub.list_weights(); "
        "print(sorted({'torchvision', 'torch._dynamo'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
