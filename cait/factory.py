"""The one door to a model: `load_model` gives every tool (the app, `cait.evaluate`, the atlas, the analysis
scripts, scripts/, the benchmarks) and every user a CaiT with the record of where its weights came from
(`SourcedModel`): shipped weights, a paper variant's official weights (cached or downloaded), a checkpoint file,
or a random init on request (weights=False).

Missing weights are an error everywhere: one line naming the ways out (--pretrained downloads a paper
variant's official weights, --checkpoint FILE gives a file, HF_HOME points at a Hugging Face cache that holds
them), unless random_init=True (--random-init) asks for a seeded random init in their place, which every output
then flags. Command lines go through `load_from_flags`, which reads `cait.flags`' model flags.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch

from .checkpoint import CheckpointError, file_metadata, load_into, read_checkpoint
from .cnn import TimmCNN, load_cnn_weights
from .config import DEFAULT_MODEL, CNNConfig, ConfigError, get_config
from .hub import WeightsUnavailable, fetch_weights, missing_weights, variant_status
from .model import CaiT
from .provenance import RANDOM_SEED, SourcedModel, sourced

GIVE_NAME = "give a model name (see cait.list_models()) or a checkpoint that carries its config"


def requested_variant(name: str | None, checkpoint: str | os.PathLike | None) -> str | None:
    """The variant a load of (`name`, `checkpoint`) means: `name`, else DEFAULT_MODEL when no checkpoint is
    given (a checkpoint of ours names its own architecture)."""
    return name if name or checkpoint is not None else DEFAULT_MODEL


def load_model(
    name: str | None = None,
    checkpoint: str | os.PathLike | None = None,
    *,
    pretrained: bool = False,
    weights: bool = True,
    random_init: bool = False,
    cnn: bool = False,
    **overrides: Any,
) -> SourcedModel:
    """The model asked for, in eval mode, with the one record of where its weights came from.

    Args:
        name: a variant (see `cait.list_models()`); default DEFAULT_MODEL when no checkpoint is given.
            Its weights are the shipped ones (our scenes models) or, for a paper variant, timm's official
            ones from the local Hugging Face cache.
        checkpoint: a weights file instead: ours (.safetensors, carries its config, so `name` may be None),
            timm's .pth/.safetensors or the official deit .pth (these need `name`).
        pretrained: download a paper variant's official weights when they are not cached (never with
            HF_HUB_OFFLINE=1; see `cait.hub`).
        weights: False builds the architecture with a seeded random init and reads no file (training from
            scratch, tests); `checkpoint` and `pretrained` then must not be given.
        random_init: when the variant has no weights here, a seeded random init that every output flags,
            instead of `WeightsUnavailable` (the --random-init flag).
        cnn: accept a timm CNN written by `cait.train --model timm:...` (cait.evaluate scores it on top-1);
            else such a file is refused in one line.
        overrides: config fields to change, e.g. img_size=384 (the position embedding is resampled),
            num_classes=10 or drop_path_rate=0.1.

    Returns:
        A `SourcedModel`: `.model` (a `CaiT`, eval mode) and where its weights came from (`.source`,
        `.made_from`, `.trained`).

    Raises:
        InputError (CheckpointError, WeightsUnavailable, ConfigError), one line, for a name, file or
        combination that cannot work.
    """
    if not weights and (checkpoint is not None or pretrained):
        raise ConfigError("weights=False builds a random init: it takes no checkpoint and no pretrained")
    path = None if checkpoint is None else check_checkpoint_file(Path(checkpoint))
    name = requested_variant(name, checkpoint)
    named = None if name is None else get_config(name)
    status = None if path is not None or not weights else variant_status(name, named)  # the variant's own weights
    found = None if status is None or (status.path is None and not pretrained) else fetch_weights(status)
    if status is not None and found is None and not random_init:
        raise WeightsUnavailable(missing_weights(status))
    path = found.path if found else path  # None: the random init weights=False or random_init asked for
    what = found.source if found else path and path.name  # what the file is, for messages and the record
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
            raise ConfigError(GIVE_NAME)
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


def load_from_flags(args: argparse.Namespace, *, cnn: bool = False, side: str = "", **overrides: Any) -> SourcedModel:
    """The model `add_model_flags`' flags ask for, through the one door (`cait.load_model`), for every command
    line; a random init (--random-init, no weights here) is said once on stderr as well as on every output.

    Args:
        args: parsed flags holding model, checkpoint, pretrained and random_init.
        cnn: accept a timm CNN checkpoint (cait.evaluate scores one on top-1).
        side: which model of a two-model tool, as `add_model_flags` named its flags (args.model_a for "a").
        overrides: config fields to change, as `cait.load_model` takes them (e.g. img_size=384).

    Returns:
        The `SourcedModel`.

    Raises:
        InputError: one line, for a name, file or flag that cannot work (the command says it and exits 2).
    """
    flag = lambda name: getattr(args, f"{name}_{side}" if side else name)  # noqa: E731
    loaded = load_model(
        flag("model"),
        flag("checkpoint"),
        pretrained=flag("pretrained"),
        random_init=flag("random_init"),
        cnn=cnn,
        **overrides,
    )
    if not loaded.trained:
        print(f"WARNING: {loaded.notice}; using a RANDOM INIT (every output says so)", file=sys.stderr)
    return loaded
