"""Distillation teachers: a small timm CNN trained here on the same data (the paper's recipe distils its
best models from a convnet), or any CaiT checkpoint.

`python -m cait.train --model timm:resnet10t ...` trains a `cait.cnn.TimmCNN`; its safetensors file carries a
`CNNConfig`, so `load_teacher(path)` rebuilds it without being told the architecture.
"""

from __future__ import annotations

import os

from torch import nn

from ..factory import load_model

CNN_PREFIX = "timm:"  # --model timm:<name> trains a timm CNN instead of a CaiT variant


def cnn_arch(model_name: str) -> str | None:
    """ "resnet18" for "timm:resnet18"; None for a CaiT variant name."""
    return model_name[len(CNN_PREFIX) :] if model_name.startswith(CNN_PREFIX) else None


def load_teacher(path: str | os.PathLike, *, img_size: int | None = None) -> nn.Module:
    """The model in `path`, frozen, in eval mode, with a `.cfg` giving its input (img_size, in_chans,
    mean, std) and num_classes: a TimmCNN written by `cait.train --model timm:...`, or any checkpoint
    `cait.load_model` reads. img_size: the input size it is run at, if not the one it was trained at (a
    CNN takes any size; a CaiT's position embedding is resampled): a teacher can score higher above its
    training size, as a student does (FixRes)."""
    size = {} if img_size is None else {"img_size": img_size}
    return load_model(None, path, cnn=True, **size).model.requires_grad_(False)
