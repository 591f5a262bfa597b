"""`create_model`: the one builder behind every variant name and checkpoint format."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .checkpoint import CheckpointError, load_into, read_checkpoint
from .config import CaiTConfig, CNNConfig, get_config
from .hub import fetch_weights
from .model import CaiT


def create_model(
    name: str | None = None, checkpoint: str | os.PathLike | None = None, *, pretrained: bool = False, **overrides: Any
) -> CaiT:
    """Build a CaiT by variant name (see `list_models()`), optionally loading weights.

    checkpoint: an official deit .pth, a timm .pth/.safetensors, or one of our safetensors files
        (which carry their own config, so `name` may then be None).
    pretrained: load the weights shipped with this package (our Fashion-MNIST models), or for a
        paper variant timm's weights: from the local Hugging Face cache, else downloaded into it (with
        HF_HUB_OFFLINE=1 never: then a clear error says the ways out). See `cait.hub`.
    overrides: config fields to change, e.g. img_size=384 (the position embedding is resampled),
        num_classes=10 or drop_path_rate=0.1.
    """
    stored: CaiTConfig | None = None
    state = None
    source = None
    if checkpoint is None and pretrained:
        if name is None:
            raise ValueError("pretrained=True needs a model name")
        weights = fetch_weights(name)
        checkpoint, source = weights.path, weights.source
    if checkpoint is not None:
        state, stored = read_checkpoint(checkpoint)
        source = source or Path(checkpoint).name
        if isinstance(stored, CNNConfig):
            raise CheckpointError(
                f"{source} holds a timm CNN ({stored.arch}), not a CaiT: it serves as a "
                f"distillation --teacher (cait.train.teacher.load_teacher reads it)"
            )
    if stored is not None:
        cfg = stored.replace(**overrides)
    elif name is not None:
        cfg = get_config(name, **overrides)
    else:
        raise ValueError("give a model name (see cait.list_models()) or a checkpoint that carries its config")
    model = CaiT(cfg, init_weights=state is None)  # loaded weights replace every parameter (strictly)
    if state is not None:
        load_into(model, state, source)
    if source is not None:
        model.source = source
    return model.eval()
