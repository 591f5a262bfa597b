"""The one way in to a model: `load_model` gives every tool (the app, `cait.evaluate`, the analysis scripts,
scripts/) a model with the record of where its weights came from, under one policy for missing weights;
`create_model` is the plain builder (a CaiT by variant name and/or checkpoint), as timm's is.

Missing weights are an error everywhere: one line naming the ways out (--pretrained downloads a paper
variant's official weights, --checkpoint FILE gives a file, HF_HOME points at a Hugging Face cache that holds
them), unless random_init=True (--random-init) asks for a seeded random init, which every output then flags.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .checkpoint import CheckpointError, file_metadata, load_into, read_checkpoint
from .cnn import TimmCNN, load_cnn_weights
from .config import DEFAULT_MODEL, CNNConfig, get_config
from .hub import WeightsUnavailable, fetch_weights, missing_weights, variant_status
from .model import CaiT
from .provenance import RANDOM_SEED, SourcedModel, sourced

GIVE_NAME = "give a model name (see cait.list_models()) or a checkpoint that carries its config"


def create_model(
    name: str | None = None, checkpoint: str | os.PathLike | None = None, *, pretrained: bool = False, **overrides: Any
) -> CaiT:
    """Build a CaiT by variant name (see `list_models()`): with neither `checkpoint` nor `pretrained`, timm's
    random init of that architecture; else with the weights `load_model` reads for them.

    checkpoint: an official deit .pth, a timm .pth/.safetensors, or one of our safetensors files
        (which carry their own config, so `name` may then be None).
    pretrained: load the weights shipped with this package (our Fashion-MNIST models), or for a
        paper variant timm's weights: from the local Hugging Face cache, else downloaded into it (with
        HF_HUB_OFFLINE=1 never: then a clear error says the ways out). See `cait.hub`.
    overrides: config fields to change, e.g. img_size=384 (the position embedding is resampled),
        num_classes=10 or drop_path_rate=0.1.
    """
    if name is None and checkpoint is None:
        raise ValueError("pretrained=True needs a model name" if pretrained else GIVE_NAME)
    if checkpoint is None and not pretrained:
        return CaiT(get_config(name, **overrides)).eval()
    return load_model(name, checkpoint, pretrained=pretrained, **overrides).model


def requested_variant(name: str | None, checkpoint: str | os.PathLike | None) -> str | None:
    """The variant a load of (`name`, `checkpoint`) means: `name`, else DEFAULT_MODEL when no checkpoint is
    given (a checkpoint of ours names its own architecture)."""
    return name if name or checkpoint is not None else DEFAULT_MODEL


def load_model(
    name: str | None = None,
    checkpoint: str | os.PathLike | None = None,
    *,
    pretrained: bool = False,
    random_init: bool = False,
    cnn: bool = False,
    **overrides: Any,
) -> SourcedModel:
    """The model a tool asks for, in eval mode, with the one record of where its weights came from.

    checkpoint: that file (ours carry their config, so `name` may be None; timm and deit files need it).
    Else the weights of `name` (default DEFAULT_MODEL): shipped with the package, or a paper variant's
    official ones in the local Hugging Face cache; pretrained=True downloads those when not cached.
    Missing weights raise WeightsUnavailable, one line naming the ways out, unless random_init=True: then a
    seeded random init that every output flags.
    cnn: accept a timm CNN written by `cait.train --model timm:...` (cait.evaluate scores it on top-1);
    else such a file is refused in one line. overrides: config fields, as for `create_model`.
    The config is read once and the weights' status computed once. Raises CheckpointError / ValueError
    with one line for a checkpoint or name that cannot work."""
    path = None if checkpoint is None else check_checkpoint_file(Path(checkpoint))
    name = requested_variant(name, checkpoint)
    named = None if name is None else get_config(name)
    status = None if path is not None else variant_status(name, named)  # of the variant's own weights
    weights = None if status is None or (status.path is None and not pretrained) else fetch_weights(status)
    if status is not None and weights is None and not random_init:
        raise WeightsUnavailable(missing_weights(status))
    path = weights.path if weights else path  # None: the random init random_init asked for
    what = weights.source if weights else path and path.name  # what the file is, for messages and the record
    state, stored = read_checkpoint(path) if path else (None, None)
    meta = file_metadata(path) if path else {}
    if isinstance(stored, CNNConfig):
        if not cnn:
            raise CheckpointError(
                f"{what} holds a timm CNN ({stored.arch}), not a CaiT: it serves as a distillation --teacher "
                f"(cait.train reads it) and is scored by cait.evaluate"
            )
        model = TimmCNN(stored.replace(**overrides))
        load_cnn_weights(model, state, what)
    else:
        if stored is None and named is None:
            raise ValueError(GIVE_NAME)
        if named is not None and stored is not None and named.network_differences(stored):
            name = None  # a file of ours with another architecture: never called by that variant's name
        with torch.random.fork_rng():  # a random init: the same numbers on every run
            torch.manual_seed(RANDOM_SEED)
            model = CaiT((named if stored is None else stored).replace(**overrides), init_weights=state is None)
        if state is not None:
            load_into(model, state, what)  # the loaded weights replace every parameter (strictly)
    return sourced(model.eval(), name, path, what, status, meta)


def check_checkpoint_file(path: Path) -> Path:
    """`path`, or a one-line CheckpointError for a path that cannot be a checkpoint: missing, a directory, empty,
    text."""
    if path.is_dir():
        raise CheckpointError(f"{path} is a directory; give the checkpoint file inside it (.pth or .safetensors)")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head:
        raise CheckpointError(f"{path.name} is empty (0 bytes), not a checkpoint")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return path  # binary: the reader decides what it is
    if "\0" in text or not all(c.isprintable() or c.isspace() for c in text):
        return path  # binary too (a safetensors file starts with 8 length bytes, mostly zeros)
    first = text.strip().splitlines()[0][:60] if text.strip() else ""
    raise CheckpointError(
        f"{path.name} is a text file, not a checkpoint (it starts with {first!r}); "
        f"give a .pth or .safetensors weights file"
    )
