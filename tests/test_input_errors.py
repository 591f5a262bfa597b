"""Errors in two kinds (issue 46): what a user can get wrong (a name, a flag, an image, a corruption) raises a
`cait.InputError` with a one-line message, never a bare ValueError, so that callers catching InputError alone
still let a bug inside torch or numpy keep its traceback."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import cait
from cait.config import CNNConfig
from cait.corruptions import corrupt
from cait.data.image_file import decode_image
from cait.runtime import autocast_dtype, choose_precision
from cait.train.augment import parse_randaug

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: cait.get_config("cait_nope"), "unknown model 'cait_nope'"),
        (lambda: autocast_dtype("fp8", CPU), "--precision must be one of"),
        (lambda: choose_precision("fp16", CPU), "--precision must be one of"),
        (lambda: parse_randaug("rand-nonsense"), "is not a timm RandAugment string"),
        (lambda: parse_randaug("rand-m12"), "--randaug magnitude must be in 0..10"),
        (
            lambda: corrupt(torch.rand(1, 3, 32, 32), "smog", 3, generator=torch.Generator()),
            "unknown corruption 'smog'",
        ),
        (lambda: corrupt(torch.rand(1, 3, 32, 32), "contrast", 9, generator=torch.Generator()), "severity must be 1-5"),
        (lambda: corrupt(torch.rand(3, 32, 32), "contrast", 3, generator=torch.Generator()), "x must be a batch"),
        (lambda: decode_image(Image.fromarray(np.full((4, 4), -1, np.int32))), "32-bit integer image .* no 8-bit"),
    ],
)
def test_a_users_mistake_is_an_input_error(call, message):
    with pytest.raises(cait.InputError, match=message) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_an_unknown_timm_cnn_is_an_input_error():
    from cait.cnn import TimmCNN

    with pytest.raises(cait.InputError, match="timm has no model 'resnet_nope'"):
        TimmCNN(CNNConfig(arch="resnet_nope", img_size=32))
