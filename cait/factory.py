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
from torch import nn

from .checkpoint import CheckpointError, load_into, read_checkpoint
from .cnn import TimmCNN, load_cnn_weights
from .config import DEFAULT_MODEL, CaiTConfig, CNNConfig, get_config
from .hub import WeightsStatus, WeightsUnavailable, fetch_weights, weights_status
from .model import CaiT
from .provenance import (
    RANDOM_SEED,
    SourcedModel,
    check_checkpoint_file,
    describe_architecture,
    describe_checkpoint,
    scale_note,
)

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
    if checkpoint is not None:
        return _from_checkpoint(name, Path(checkpoint), cnn=cnn, overrides=overrides)
    name = requested_variant(name, checkpoint)
    named = get_config(name)
    status = weights_status(name, cfg=named)  # of the variant's own weights, whatever the overrides
    cfg = named.replace(**overrides)
    if status.path is None and not pretrained:
        if not random_init:
            raise WeightsUnavailable(missing_weights(status))
        return _random_init(name, cfg, status)
    weights = fetch_weights(name, status=status)
    model = _with_weights(cfg, overrides, weights.path, weights.source)
    shipped = status.where == "shipped"
    made = (
        f"shipped {name} weights {describe_checkpoint(weights.path, model.cfg)}"
        if shipped
        else f"official {name} weights, timm's {weights.source} ({describe_architecture(model.cfg)})"
    )
    source = f"shipped weights: {weights.path.name}" if shipped else f"official weights: {weights.source}"
    return SourcedModel(model, name, source, made + scale_note(model.cfg), status=status)


def missing_weights(status: WeightsStatus) -> str:
    """The one line every tool says when a variant has no weights here and no random init was asked for."""
    name, repo = status.name, status.repo_id
    why = {
        "shipped": f"its file is not in this package (train it with `python -m cait.train --model {name}`)",
        "download": f"timm's {repo} is not in the local Hugging Face cache",
        "needs file": f"timm's {repo} is not cached and the Hub is off (HF_HUB_OFFLINE)"
        if repo
        else "there are no released weights for this size",
    }[status.where]
    ways = ["--checkpoint FILE gives a weights file"]
    if repo:
        online = "" if status.where == "download" else "online, "
        ways.insert(0, f"{online}--pretrained (the app: the download box) downloads them ({status.size_mb:.0f} MB)")
        ways.append("HF_HOME pointing at a Hugging Face cache that holds them")
    ways.append("--random-init for a seeded untrained model, flagged on every output")
    return f"no weights for '{name}' here: {why}. Ways out: {'; '.join(ways)}"


def _random_init(name: str, cfg: CaiTConfig, status: WeightsStatus) -> SourcedModel:
    """`cfg` with seeded random weights (the same numbers on every run), flagged as untrained."""
    with torch.random.fork_rng():
        torch.manual_seed(RANDOM_SEED)
        model = CaiT(cfg).eval()
    made = f"RANDOM INIT {name} ({describe_architecture(cfg)}): no shipped or cached weights, NOT a trained model"
    notice = f"Untrained: no weights for {name} here ({status.describe()})"
    return SourcedModel(model, name, f"random init (seed {RANDOM_SEED})", made, status=status, notice=notice)


def _from_checkpoint(name: str | None, path: Path, *, cnn: bool, overrides: dict[str, Any]) -> SourcedModel:
    check_checkpoint_file(path)
    state, stored = read_checkpoint(path)
    if isinstance(stored, CNNConfig):
        if not cnn:
            raise CheckpointError(
                f"{path.name} holds a timm CNN ({stored.arch}), not a CaiT: it serves as a distillation --teacher "
                f"(cait.train reads it) and is scored by cait.evaluate"
            )
        model: nn.Module = TimmCNN(stored.replace(**overrides))
        load_cnn_weights(model, state, path.name)
        made = f"checkpoint {path.name} (timm {stored.arch}, {model.cfg.img_size}px)"
        return SourcedModel(model.eval(), name, f"checkpoint {path}", made)
    if stored is None:
        if name is None:
            raise ValueError(GIVE_NAME)
        cfg = get_config(name, **overrides)
    else:
        cfg = stored.replace(**overrides)
        if name is not None and get_config(name).network_differences(stored):
            name = None  # a file of ours with another architecture: never called by that variant's name
    model = _loaded(cfg, state, path.name)
    made = "checkpoint " + describe_checkpoint(path, model.cfg) + scale_note(model.cfg)
    return SourcedModel(model, name, f"checkpoint {path}", made)


def _with_weights(named: CaiTConfig, overrides: dict[str, Any], path: Path, source: str) -> CaiT:
    """The CaiT in the weights file `path`: by the config it carries (ours), else by its variant's (`named`)."""
    state, stored = read_checkpoint(path)
    return _loaded(named if stored is None else stored.replace(**overrides), state, source)


def _loaded(cfg: CaiTConfig, state: dict[str, torch.Tensor], source: str) -> CaiT:
    model = CaiT(cfg, init_weights=False)  # the loaded weights replace every parameter (strictly)
    load_into(model, state, source)
    return model.eval()
