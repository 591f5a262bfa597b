"""Reading and writing weights: official deit .pth, timm .pth/.safetensors, and our own safetensors
files that carry their config in the metadata. (Where pretrained files come from: `cait.hub`.)

`.pth` files are read with `torch.load(weights_only=True)`: a pickle that tries to build arbitrary
objects (and so run code) is refused, never executed.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import uuid
from pathlib import Path
from typing import Any, BinaryIO, Callable

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from .config import VARIANTS, CaiTConfig, CNNConfig
from .errors import InputError

WEIGHTS_DIR = Path(__file__).parent / "weights"
CONFIG_KEY = CaiTConfig.METADATA_KEY
STORED_CONFIGS = (CaiTConfig, CNNConfig)  # the configs our files carry, each under its own metadata key


class CheckpointError(InputError):
    """A checkpoint that cannot be read or does not fit the model; the message says why."""


def atomic_write(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """`write(f)` into a temporary file next to `path`, synced, then renamed over it. The temporary name is
    unique, so processes writing the same file at once (a shared cache) never write into each other's."""
    # not tempfile.mkstemp: its files are mode 0600 whatever the umask; "x" refuses a name that exists
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_weights(model: torch.nn.Module, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write `model`'s weights as safetensors with its config (`model.cfg`) in the metadata, atomically."""
    meta = {model.cfg.METADATA_KEY: json.dumps(model.cfg.to_dict()), **(metadata or {})}
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if _holds(Path(path), tensors, meta):
        # left as it is: safetensors writes the metadata in another order in each process, so rewriting the
        # same weights (re-shipping a model) would show in git as a changed binary
        return
    # bytes through open(), not save_file: that creates its file with mode 0600, whatever the umask
    atomic_write(Path(path), lambda f: f.write(save(tensors, metadata=meta)))


def _holds(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> bool:
    """Whether the safetensors file at `path` already holds exactly these tensors and metadata."""
    try:
        with safe_open(str(path), framework="pt") as f:
            if (f.metadata() or {}) != meta or set(f.keys()) != set(tensors):
                return False
            return all(torch.equal(f.get_tensor(k), v) for k, v in tensors.items())
    except Exception:  # no file, or not one safetensors reads: write it
        return False


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], CaiTConfig | CNNConfig | None]:
    """State dict (prefixes stripped) and, for our own files, the config stored with it (a CaiT's, or a
    CNN teacher's)."""
    path = _existing(path)
    config = None
    try:
        if _is_safetensors(path):
            config = _config_in(path)
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path.name}: refused to load. It is a pickle that holds more than tensors "
            f"(weights_only=True blocked it, so none of its code ran): {str(e).splitlines()[0]}"
        )
    except CheckpointError:
        raise
    except Exception as e:  # truncated files, random bytes, wrong format
        raise _unreadable(path, e) from None
    return _unwrap(state, path.name), config


def file_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The metadata of one of our safetensors files (config, epochs_completed, data, step, val_top1);
    {} for files without any (timm / deit .pth), whose real problems the loader reports."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception:
        return {}


def stored_config(path: str | os.PathLike) -> CaiTConfig | CNNConfig | None:
    """The config our safetensors file at `path` carries, read from its header alone (no tensors); None for
    other files (deit/timm .pth) and for safetensors without one. Unreadable files raise CheckpointError."""
    path = _existing(path)
    try:
        return _config_in(path) if _is_safetensors(path) else None
    except Exception as e:
        raise _unreadable(path, e) from None


def _existing(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    return path


def _unreadable(path: Path, e: Exception) -> CheckpointError:
    return CheckpointError(f"{path.name}: not a readable checkpoint ({type(e).__name__}: {e})")


def _config_in(path: Path) -> CaiTConfig | CNNConfig | None:
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    return next(
        (cls.from_dict(json.loads(meta[cls.METADATA_KEY])) for cls in STORED_CONFIGS if cls.METADATA_KEY in meta), None
    )


def _is_safetensors(path: Path) -> bool:
    if path.suffix == ".safetensors":
        return True
    with open(path, "rb") as f:
        head = f.read(8)
    # safetensors starts with a little-endian u64 header length followed by '{'
    return len(head) == 8 and 0 < int.from_bytes(head, "little") < 100_000_000 and not head.startswith(b"PK")


def _unwrap(obj: Any, name: str) -> dict[str, torch.Tensor]:
    # Official deit files are {"model": state_dict, ...}; DDP-saved ones prefix keys with "module.".
    for key in ("model", "state_dict", "model_ema"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{name}: expected a state dict of tensors, found {type(obj).__name__}")
    return {re.sub(r"^module\.", "", k): v for k, v in obj.items()}


def infer_config(state: dict[str, torch.Tensor]) -> dict[str, int]:
    """Architecture read off a state dict's shapes (what the weights are, whatever the file says)."""

    def count(prefix: str) -> int:
        return len({k.split(".")[1] for k in state if k.startswith(prefix + ".")})

    out: dict[str, int] = {"depth": count("blocks"), "depth_token_only": count("blocks_token_only")}
    if "cls_token" in state:
        out["embed_dim"] = state["cls_token"].shape[-1]
    if "patch_embed.proj.weight" in state:
        w = state["patch_embed.proj.weight"]
        out["patch_size"], out["in_chans"] = w.shape[-1], w.shape[1]
    if "pos_embed" in state:
        out["grid"] = int(round(state["pos_embed"].shape[1] ** 0.5))
    if "head.weight" in state:
        out["num_classes"] = state["head.weight"].shape[0]
    if "blocks.0.attn.proj_l.weight" in state:
        out["num_heads"] = state["blocks.0.attn.proj_l.weight"].shape[0]
    return out


def closest_variant(state: dict[str, torch.Tensor]) -> str:
    """The known variant whose architecture matches the state dict best (ties: lower resolution)."""
    found = infer_config(state)

    def score(cfg: CaiTConfig) -> int:
        want = {
            "depth": cfg.depth,
            "depth_token_only": cfg.depth_token_only,
            "embed_dim": cfg.embed_dim,
            "patch_size": cfg.patch_size,
            "in_chans": cfg.in_chans,
            "grid": cfg.grid_size,
            "num_classes": cfg.num_classes,
            "num_heads": cfg.num_heads,
        }
        return sum(found.get(k) == v for k, v in want.items())

    return max(VARIANTS, key=lambda n: score(VARIANTS[n]))


def load_into(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load `state` into `model` strictly, resampling the position embedding if only the grid differs.
    Anything else that does not fit raises one CheckpointError naming the likely variant and the diff."""
    from .model import resize_pos_embed

    given, state = state, dict(state)  # `given` as the file has it: the error describes it, not its resampling
    target = model.state_dict()
    pe = state.get("pos_embed")
    if pe is not None and pe.shape[-1] == target["pos_embed"].shape[-1] and pe.shape != target["pos_embed"].shape:
        state["pos_embed"] = resize_pos_embed(pe, model.cfg.grid_size)
    missing = sorted(set(target) - set(state))
    unexpected = sorted(set(state) - set(target))
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(target[k].shape)}"
        for k in target
        if k in state and state[k].shape != target[k].shape
    ]
    if missing or unexpected or shapes:
        lines = [
            f"{source} does not fit this model ({_describe(model.cfg)}).",
            f"It looks like '{closest_variant(given)}' ({_describe_found(infer_config(given))}).",
        ]
        for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)):
            if items:
                more = f" ... (+{len(items) - 8} more)" if len(items) > 8 else ""
                lines.append(f"{label} ({len(items)}): {', '.join(items[:8])}{more}.")
        raise CheckpointError(" ".join(lines))  # one line: every command's one-line error carries the diagnosis
    model.load_state_dict(state, strict=True)


def _describe(cfg: CaiTConfig) -> str:
    return (
        f"depth {cfg.depth}+{cfg.depth_token_only}, dim {cfg.embed_dim}, heads {cfg.num_heads}, "
        f"patch {cfg.patch_size}, {cfg.img_size}px, {cfg.num_classes} classes"
    )


def _describe_found(found: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in found.items())


def grow_depth(state: dict[str, torch.Tensor], depth: int, *, gamma: float) -> dict[str, torch.Tensor]:
    """`state` with its self-attention blocks spread over `depth` blocks: new block j copies old block
    j * old_depth // depth, and each copy after the first gets LayerScale gammas equal to `gamma`.

    Why this works: a block's branch enters the residual stream scaled by its gammas, so copies with small
    gammas barely change the function. The deeper model starts at the shallower one's accuracy, and its new
    blocks start from trained weights rather than noise."""
    old = infer_config(state)["depth"]
    if not 0 < old <= depth:
        raise CheckpointError(f"cannot grow {old} self-attention blocks into {depth}")
    grown = {k: v for k, v in state.items() if not k.startswith("blocks.")}
    for j in range(depth):
        source = j * old // depth
        is_copy = j > 0 and (j - 1) * old // depth == source
        prefix = f"blocks.{source}."
        for key, value in state.items():
            if key.startswith(prefix):
                name = key[len(prefix) :]
                fresh = is_copy and name.startswith("gamma_")
                grown[f"blocks.{j}.{name}"] = torch.full_like(value, gamma) if fresh else value.clone()
    return grown
