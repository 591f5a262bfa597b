"""A timm CNN classifier with its config (`TimmCNN`): what `cait.train --model timm:NAME` trains as a distillation
teacher, and what `cait.load_model` rebuilds from the safetensors file it writes (which carries a `CNNConfig`),
for training and evaluation alike."""

from __future__ import annotations

import torch
from torch import nn

from .checkpoint import CheckpointError
from .config import CNNConfig, ConfigError


class TimmCNN(nn.Module):
    """A timm classifier with its config: what `cait.train` and `save_weights` need of a model."""

    def __init__(self, cfg: CNNConfig):
        super().__init__()
        import timm

        if not timm.is_model(cfg.arch):
            raise ConfigError(f"timm has no model '{cfg.arch}' (see timm.list_models(), e.g. resnet10t, resnet18)")
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


def load_cnn_weights(model: TimmCNN, state: dict[str, torch.Tensor], source: str) -> None:
    """Load `state` strictly; weights of another architecture raise one CheckpointError line."""
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(
            f"{source}: the weights do not fit timm's {model.cfg.arch} ({str(e).splitlines()[0]})"
        ) from None
