"""Where a loaded model's weights came from, said once for every tool (`SourcedModel`, which `cait.load_model`
returns): a checkpoint file, the weights shipped with the package (with their model card and test accuracy),
timm's official weights (`cait.hub`), or a seeded random init that says so loudly; and the one line that says
what a figure or a number was made from.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from torch import nn

from .checkpoint import WEIGHTS_DIR
from .config import CaiTConfig, CNNConfig
from .hub import WeightsStatus

RANDOM_SEED = 0  # the random init of a model without weights: the same numbers on every run


@dataclass(frozen=True)
class ShippedCard:
    """The model card and evaluation shipped beside a model's weights in cait/weights/."""

    card: Path  # <name>.md: how it was trained, its curves and what it does badly
    test_top1: float  # top-1 accuracy in [0, 1] on the evaluation below, from <name>.eval.json
    test_images: int  # how many test images that accuracy is over
    data: str  # what it was evaluated on, e.g. "fashion-mnist-scenes"
    robustness: dict | None = None  # <name>.robustness.json (`cait.robustness.shipped_summary`), when shipped


def shipped_card(cfg: CaiTConfig) -> ShippedCard | None:
    """The card of a config with shipped weights, read from its files (None when there is no card or no
    readable evaluation beside the weights)."""
    if not cfg.pretrained:
        return None
    stem = WEIGHTS_DIR / Path(cfg.pretrained).stem
    card, evaluation = stem.with_suffix(".md"), stem.with_suffix(".eval.json")
    try:
        robustness = json.loads(stem.with_suffix(".robustness.json").read_text())
    except (OSError, ValueError):
        robustness = None
    try:
        result = json.loads(evaluation.read_text())
        return ShippedCard(
            card=card,
            test_top1=float(result["top1"]),
            test_images=int(result["images"]),
            data=str(result.get("data", "")),
            robustness=robustness,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class SourcedModel:
    """A loaded model beside the one record of where its weights came from."""

    model: nn.Module  # a CaiT (or, where asked for, the timm CNN of a distillation teacher), in eval mode
    name: str | None  # the variant it is: the one asked for, or the default; None for a checkpoint of ours loaded
    # without a name or holding another architecture than the one named
    source: str  # short: "shipped weights: x.safetensors", "checkpoint /p/x.pth", "random init (seed 0)"
    made_from: str  # one line for figures and numbers: the file with its architecture and training
    status: WeightsStatus | None = None  # where the variant's weights stood at the load (None: a checkpoint)
    notice: str = ""  # "" or why the weights are random, for wherever the model's numbers are shown
    weights_id: str = ""  # what the weights are, whatever their path: `weights_identity`; in `made_from` too

    @property
    def trained(self) -> bool:
        """False for a random init."""
        return not self.notice


def describe_architecture(cfg: CaiTConfig) -> str:
    return (
        f"{cfg.img_size}px, patch {cfg.patch_size}, dim {cfg.embed_dim}, {cfg.depth} SA + "
        f"{cfg.depth_token_only} CA, {cfg.num_heads} heads, residual {cfg.residual_scale}"
    )


def describe_checkpoint(path: Path, cfg: CaiTConfig, meta: dict[str, str]) -> str:
    """'<file> (<architecture>; trained N epochs on DATA, val top-1 X%)' from what the file says (`meta`, its
    `cait.checkpoint.file_metadata`)."""
    training = []
    epochs = meta.get("epochs_completed", meta.get("epoch"))
    if epochs:
        training.append(f"{epochs} epochs")
    if meta.get("data"):
        training.append(f"on {meta['data']}")
    if meta.get("val_top1") not in (None, "None"):
        training.append(f"val top-1 {float(meta['val_top1']):.1%}")
    trained = f"; trained {' '.join(training)}" if training else ""
    return f"{path.name} ({describe_architecture(cfg)}{trained})"


def weights_identity(path: Path | None, status: WeightsStatus | None) -> str:
    """The identity of the weights a load read from `path` (None: the seeded random init): "Hub revision <12
    hex>" for timm's weights from the Hugging Face cache (a snapshot holds one revision's files), else "sha256
    <12 hex>" of the file's bytes, so that a file trained again at the same path is another model everywhere
    (its atlases, its numbers). Hashed once per file version (`file_sha256`)."""
    if path is None:
        return f"random init, seed {RANDOM_SEED}"
    if status is not None and status.repo_id and path.parent.parent.name == "snapshots":
        return f"Hub revision {path.parent.name[:12]}"
    found = path.stat()
    return f"sha256 {file_sha256(str(path.resolve()), found.st_ino, found.st_mtime_ns, found.st_size)[:12]}"


@lru_cache(maxsize=64)
def file_sha256(path: str, inode: int, mtime_ns: int, size: int) -> str:
    """The file's sha256, kept per version of the file (inode, mtime, size: an atomic rewrite is a new inode), so
    that loading the same file again (the app's model cache, a second tool) costs nothing more; the first load
    of a file reads it twice (measured in benchmarks/README.md)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def scale_note(cfg: CaiTConfig) -> str:
    """Said after every description of one of our models."""
    # Our Fashion-MNIST models are miniatures: never let their numbers pass for the paper's.
    return "" if cfg.is_imagenet else " - a miniature model, not the paper's ImageNet one"


def sourced(
    model: nn.Module,
    name: str | None,
    path: Path | None,
    weights: str | None,
    status: WeightsStatus | None,
    meta: dict[str, str],
) -> SourcedModel:
    """`model` with its record: loaded from `path`, a checkpoint the user gave (`status` None) or the variant's
    shipped or official weights (`weights`: what they are, `cait.hub.LocalWeights.source`; `meta`: the file's
    metadata); or, without a file, the seeded random init that random_init (`status`: why) or weights=False
    (`status` None) asked for, flagged everywhere."""
    cfg, identity = model.cfg, weights_identity(path, status)
    if path is None:
        why = "no shipped or cached weights" if status else "a random init as asked"
        made = f"RANDOM INIT {name} ({describe_architecture(cfg)}): {why}, NOT a trained model"
        notice = f"Untrained: no weights for {name} here ({status.describe()})" if status else "Untrained: asked for"
        source = f"random init (seed {RANDOM_SEED})"
        return SourcedModel(model, name, source, made, status=status, notice=notice, weights_id=identity)
    if isinstance(cfg, CNNConfig):
        made = f"checkpoint {path.name} (timm {cfg.arch}, {cfg.img_size}px); weights {identity}"
        return SourcedModel(model, name, f"checkpoint {path}", made, weights_id=identity)
    if status is None:
        made, source = "checkpoint " + describe_checkpoint(path, cfg, meta), f"checkpoint {path}"
    elif status.where == "shipped":
        made, source = f"shipped {name} weights {describe_checkpoint(path, cfg, meta)}", f"shipped weights: {path.name}"
    else:
        made, source = (
            f"official {name} weights, timm's {weights} ({describe_architecture(cfg)})",
            f"official weights: {weights}",
        )
    made += f"{scale_note(cfg)}; weights {identity}"
    return SourcedModel(model, name, source, made, status=status, weights_id=identity)
