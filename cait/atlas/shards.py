"""The atlas's work in shards: consecutive runs of images whose numbers are written to OUT/shards/ as soon as
they are done (one .npz each, written to a temporary name and renamed, so a kill leaves no half shard). A
rerun with the same arguments skips the shards on disk; torchrun's ranks take every world-th shard, so each
image is done once, and the shards (hence the numbers) are the same whatever the number of processes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm import tqdm

from ..preprocess import normalise
from .compute import batch_numbers, corrupted_views

ARGS_FILE = "atlas_args.json"  # the arguments the shards were made with
SHARD_DIR = "shards"


def shard_path(out: Path, shard: int) -> Path:
    return out / SHARD_DIR / f"shard-{shard:05d}.npz"


def missing_shards(out: Path, shards: int) -> list[int]:
    return [s for s in range(shards) if not shard_path(out, s).exists()]


def args_problem(out: Path, recorded: dict[str, Any]) -> str | None:
    """One line when OUT already holds shards made with other arguments (None: they can be continued)."""
    try:
        before = json.loads((out / ARGS_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"{out / ARGS_FILE} is unreadable ({type(e).__name__}); use another --out or delete it"
    changed = [f"{_flag(k)} {before.get(k)} there, {v} here" for k, v in recorded.items() if before.get(k) != v]
    if not changed:
        return None
    return f"{out} holds an atlas made with other arguments ({'; '.join(changed)}): use another --out or delete it"


def _flag(key: str) -> str:
    """How a recorded argument is named in a message: as its flag, or in words for what the run found (how many
    images the data held, the precision --precision chose)."""
    return key.replace("_", " ") if key in ("images", "precision_used") else f"--{key.replace('_', '-')}"


def record_args(out: Path, recorded: dict[str, Any]) -> None:
    write_atomic(out / ARGS_FILE, json.dumps(recorded, indent=1).encode())


def write_atomic(path: Path, data: bytes) -> None:
    """`data` to `path` by a rename: a reader (or a kill) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_shard(path: Path, arrays: dict[str, np.ndarray]) -> None:
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_atomic(path, buffer.getvalue())


def read_shard(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def _shard_numbers(
    model: nn.Module,
    loader: DataLoader,
    *,
    knockouts: bool,
    patching: tuple[str, int] | None,
    dtype,
    device: torch.device,
    bar: tqdm,
) -> Iterator[dict[str, np.ndarray]]:
    """The numbers of every readable image of a shard's loader, batch by batch, with the indices of the rest."""
    for pixels, label, box, index, ok in loader:
        rows = {"index": index[ok].numpy(), "label": label[ok].numpy(), "skipped": index[~ok].numpy()}
        if ok.any():
            views = pixels[ok].to(device)
            x = normalise(views, model.cfg)
            corrupted = None if patching is None else normalise(corrupted_views(views, index[ok], patching), model.cfg)
            rows |= batch_numbers(model, x, box[ok], knockouts=knockouts, dtype=dtype, corrupted=corrupted)
        bar.update(len(index))
        yield rows


def run_shards(
    model: nn.Module,
    data: Dataset,
    shards: list[range],
    todo: list[int],
    out: Path,
    *,
    batch_size: int,
    workers: int,
    knockouts: bool,
    dtype: torch.dtype | None,
    device: torch.device,
    show: bool,
    patching: tuple[str, int] | None = None,
    stop_after: int | None = None,
) -> None:
    """Compute and write shards `todo` (indices into `shards`) not yet on disk, at most `stop_after` of them;
    data yields unnormalised (pixels, label, box, index, ok) items (`cait.data.read_images(..., normalise=False)`).
    patching: (corruption, severity) to patch each image's predicted class into its corrupted twin."""
    todo = [s for s in todo if not shard_path(out, s).exists()][:stop_after]
    with tqdm(total=sum(len(shards[s]) for s in todo), unit="img", desc="atlas", disable=not show) as bar:
        for s in todo:
            loader = DataLoader(Subset(data, shards[s]), batch_size=batch_size, num_workers=workers)
            numbers = dict(knockouts=knockouts, patching=patching, dtype=dtype, device=device, bar=bar)
            parts = list(_shard_numbers(model, loader, **numbers))
            keys = {k for p in parts for k in p}
            arrays = {k: np.concatenate([p[k] for p in parts if k in p]) for k in keys}
            write_shard(shard_path(out, s), arrays)
