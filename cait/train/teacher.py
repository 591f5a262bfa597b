"""Distillation teachers: a small timm CNN trained here on the same data (the paper's recipe distils its
best models from a convnet), or any CaiT checkpoint.

`python -m cait.train --model timm:resnet10t ...` trains a `TimmCNN`; its safetensors file carries a
`CNNConfig`, so `load_teacher(path)` rebuilds it without being told the architecture.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..checkpoint import CheckpointError, read_checkpoint
from ..config import CNNConfig

CNN_PREFIX = "timm:"  # --model timm:<name> trains a timm CNN instead of a CaiT variant


def cnn_arch(model_name: str) -> str | None:
    """ "resnet18" for "timm:resnet18"; None for a CaiT variant name."""
    return model_name[len(CNN_PREFIX) :] if model_name.startswith(CNN_PREFIX) else None


class TimmCNN(nn.Module):
    """A timm classifier with its config: what `cait.train` and `save_weights` need of a model."""

    def __init__(self, cfg: CNNConfig):
        super().__init__()
        import timm

        if not timm.is_model(cfg.arch):
            raise ValueError(f"timm has no model '{cfg.arch}' (see timm.list_models(), e.g. resnet10t, resnet18)")
        self.cfg = cfg
        extra = {"drop_path_rate": cfg.drop_path_rate} if cfg.drop_path_rate else {}
        self.net = timm.create_model(
            cfg.arch, pretrained=False, num_classes=cfg.num_classes, in_chans=cfg.in_chans, **extra
        )
        # oneDNN's convolutions run channels-last natively; NCHW costs layout conversions (benchmarks/README.md)
        self.net.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.contiguous(memory_format=torch.channels_last))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def load_teacher(path: str | os.PathLike, *, img_size: int | None = None) -> nn.Module:
    """The model in `path`, frozen, in eval mode, with a `.cfg` giving its input (img_size, in_chans,
    mean, std) and num_classes: a TimmCNN written by `cait.train --model timm:...`, or any checkpoint
    `cait.create_model` reads. img_size: the input size it is run at, if not the one it was trained at (a
    CNN takes any size; a CaiT's position embedding is resampled): a teacher can score higher above its
    training size, as a student does (FixRes)."""
    state, stored = read_checkpoint(path)
    size = {} if img_size is None else {"img_size": img_size}
    if isinstance(stored, CNNConfig):
        model = TimmCNN(stored.replace(**size))
        load_cnn_weights(model, state, os.fspath(path))
        model.source = os.path.basename(path)  # as create_model names its weights
    else:
        from ..factory import create_model

        model = create_model(None, checkpoint=path, **size)
    return model.eval().requires_grad_(False)


def load_cnn_weights(model: TimmCNN, state: dict[str, torch.Tensor], source: str) -> None:
    """Load `state` strictly; weights of another architecture raise one CheckpointError line."""
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(
            f"{source}: the weights do not fit timm's {model.cfg.arch} ({str(e).splitlines()[0]})"
        ) from None
