"""The atlas's work in shards: consecutive runs of images whose numbers are written to OUT/shards/ as soon as
they are done, one `shard-START-STOP.npz` each (images START..STOP-1), written to a temporary name and renamed,
so a kill or a full disk leaves no half shard.

A shard carries what it covers: its image range, a hash of those images' paths, a hash of the arguments that
change the numbers (and of the atlas's `FORMAT`), and a checksum of its arrays. A rerun verifies every shard on
disk and redoes one that is damaged, made for other images or arguments, or that skipped images (an unreadable
file may be readable now; a shard whose skipped files fail again for the reasons it recorded is kept), saying so
in a line. What is left to do is split evenly over torchrun's ranks in whole batches (the batches of a
one-process run, so the numbers are the same), in shards of at most --shard-size images,
whatever the shard size (`cait.distributed.balanced_runs`)."""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm import tqdm

from ..checkpoint import atomic_write
from ..preprocess import normalise
from .compute import batch_numbers, corrupted_views

ARGS_FILE = "atlas_args.json"  # the arguments the shards were made with, and their format
# What an atlas's shards hold and mean; bumped whenever that changes, so that a rerun into an atlas of another
# format is refused in one line instead of continuing it with shards of two kinds. 1: the first one recorded.
FORMAT = 1
SHARD_DIR = "shards"
META = "meta"  # the shard's array holding what it covers, as JSON
SKIP_REASONS = "skip_reasons"  # the shard's array of why each skipped image could not be read


class ShardError(ValueError):
    """A shard file that is not what its name says (damaged, or made for other images or arguments)."""


@dataclass(frozen=True)
class Cover:
    """What one atlas's shards must carry: the hash of the arguments that change the numbers, and the paths of
    every image (a shard hashes its own range of them)."""

    args_sha256: str
    paths: list[str]

    @classmethod
    def of(cls, recorded: dict[str, Any], paths: list[str]) -> "Cover":
        return cls(_sha256(json.dumps(recorded, sort_keys=True, default=str).encode()), list(paths))

    def meta(self, images: range) -> dict[str, Any]:
        paths = "\n".join(self.paths[images.start : images.stop]).encode()
        return {
            "start": images.start,
            "stop": images.stop,
            "paths_sha256": _sha256(paths),
            "args_sha256": self.args_sha256,
        }


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def shard_path(out: Path, images: range) -> Path:
    return out / SHARD_DIR / f"shard-{images.start:07d}-{images.stop:07d}.npz"


def shard_range(path: Path) -> range | None:
    """The image range a shard file's name says, None for a name that is not a shard's."""
    parts = path.stem.split("-")
    if len(parts) != 3 or parts[0] != "shard" or not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    start, stop = int(parts[1]), int(parts[2])
    return range(start, stop) if stop > start else None


def checksum(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over every array's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}:{a.dtype.str}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def write_shard(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """The arrays and what they cover (`meta` plus their checksum) to `path`, atomically."""
    meta = {**meta, "checksum": checksum(arrays)}
    try:
        atomic_write(path, lambda f: np.savez(f, **arrays, **{META: np.array(json.dumps(meta, sort_keys=True))}))
    except OSError as e:  # named by the shard, not by its temporary file (which is gone)
        raise OSError(e.errno, e.strerror, str(path)) from None


def read_shard(path: Path, cover: Cover | None = None) -> dict[str, np.ndarray]:
    """A shard's arrays, checked against its checksum and, with `cover`, against the images and arguments its
    name and this atlas say. Raises ShardError in one line for a file that is not what it should be."""
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        meta = json.loads(str(arrays.pop(META)))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise ShardError(f"{path.name} is damaged ({type(e).__name__})") from None
    if meta.get("checksum") != checksum(arrays):
        raise ShardError(f"{path.name} is damaged (its checksum does not match)")
    images = shard_range(path)
    if images is None or (meta.get("start"), meta.get("stop")) != (images.start, images.stop):
        raise ShardError(f"{path.name} holds images {meta.get('start')}-{meta.get('stop')}, not the ones its name says")
    if cover is not None:
        want = cover.meta(images)
        if meta.get("args_sha256") != want["args_sha256"]:
            raise ShardError(f"{path.name} was made with other arguments")
        if meta.get("paths_sha256") != want["paths_sha256"]:
            raise ShardError(f"{path.name} was made for other images")
    return arrays


def shard_files(out: Path) -> dict[range, Path]:
    """The shard files in OUT/shards/ by the image range their names say."""
    found = ((shard_range(p), p) for p in sorted((out / SHARD_DIR).glob("shard-*.npz")))
    return {images: p for images, p in found if images is not None}


def tiling(files: dict[range, Path], images: int) -> list[Path] | None:
    """Shard files covering images 0..images-1 once each, in order (None while some are not covered)."""
    by_start = {r.start: (r, p) for r, p in sorted(files.items(), key=lambda rp: len(rp[0]))}  # longest wins
    order, at = [], 0
    while at < images:
        if at not in by_start or by_start[at][0].stop > images:
            return None
        r, p = by_start[at]
        order.append(p)
        at = r.stop
    return order


def verified(
    out: Path, cover: Cover, *, say=print, skip_reason: Callable[[int], str | None] | None = None
) -> list[range]:
    """The image ranges the shards on disk hold, after checking each: a damaged or foreign shard, and one that
    skipped images (to retry them), is removed with a line saying so, and so are leftover temporary files (the
    caller holds OUT's lock: no other run writes there). skip_reason: why image i cannot be read now (None: it
    reads); a shard whose skipped images all fail again for the reasons it recorded is kept, with a line."""
    for leftover in (out / SHARD_DIR).glob("*.tmp"):
        leftover.unlink(missing_ok=True)
    kept = []
    for images, path in shard_files(out).items():
        if path.is_dir():  # not ours to delete
            raise ShardError(f"{path} is a folder, not a shard file: move or delete it")
        try:
            if images.stop > len(cover.paths):
                raise ShardError(f"{path.name} covers images past the {len(cover.paths)} of this data")
            shard = read_shard(path, cover)
        except ShardError as e:
            say(f"{e}: redoing it")
            path.unlink(missing_ok=True)
            continue
        skipped = len(shard["skipped"])
        if skipped and _fail_again(shard, skip_reason):
            reasons = ", ".join(sorted(set(shard[SKIP_REASONS].tolist())))
            say(f"{path.name}: its {skipped} unreadable image(s) failed again for the same reason ({reasons}): kept")
        elif skipped:
            say(f"{path.name} skipped {skipped} unreadable image(s): retrying them")
            path.unlink(missing_ok=True)
            continue
        kept.append(images)
    return kept


def _fail_again(shard: dict[str, np.ndarray], skip_reason: Callable[[int], str | None] | None) -> bool:
    """Whether every image the shard skipped still cannot be read, for the reason the shard recorded (a file
    tried alone: cheaper than redoing its shard)."""
    if skip_reason is None or SKIP_REASONS not in shard:
        return False
    return all(skip_reason(i) == why for i, why in zip(shard["skipped"].tolist(), shard[SKIP_REASONS].tolist()))


def todo_images(done: list[range], images: int) -> list[int]:
    """The image indices no shard in `done` covers, in order."""
    covered = np.zeros(images, dtype=bool)
    for r in done:
        covered[r.start : r.stop] = True
    return np.flatnonzero(~covered).tolist()


def args_problem(out: Path, recorded: dict[str, Any], *, what: str = "atlas") -> str | None:
    """One line when OUT already holds an atlas this run cannot continue: made by a cait.atlas of another format
    (`FORMAT`; one from before atlas_args.json existed has only its merged files), or with other arguments.
    None: there is nothing, or shards that can be continued. what: the run's kind, as the lines name it (an atlas,
    a comparison: `cait.compare` shares this folder's machinery)."""
    a_what = f"{'an' if what[0] in 'aeiou' else 'a'} {what}"
    try:
        before = json.loads((out / ARGS_FILE).read_text())
    except FileNotFoundError:
        return _made_before_formats(out, "no " + ARGS_FILE, a_what) if (out / "summary.json").exists() else None
    except (OSError, ValueError) as e:
        return f"{out / ARGS_FILE} is unreadable ({type(e).__name__}); use another --out or delete it"
    if not isinstance(before, dict):
        return f"{out / ARGS_FILE} is not {a_what}'s arguments; use another --out or delete it"
    made = before.get("format")
    if made is None:
        return _made_before_formats(out, f"no format in {ARGS_FILE}", a_what)
    if made != FORMAT:
        which = "a newer" if isinstance(made, int) and made > FORMAT else "another"
        return (
            f"{out} holds {a_what} of format {made}, made by {which} version of cait.atlas (this one makes format "
            f"{FORMAT}): it cannot be continued; use another --out, or delete it to make it again"
        )
    changed = [f"{_flag(k)} {before.get(k)} there, {v} here" for k, v in recorded.items() if before.get(k) != v]
    if not changed:
        return None
    return f"{out} holds {a_what} made with other arguments ({'; '.join(changed)}): use another --out or delete it"


def _made_before_formats(out: Path, sign: str, a_what: str) -> str:
    return (
        f"{out} holds {a_what} made by an older version of cait.atlas ({sign}): it cannot be continued; use "
        f"another --out, or delete it to make it again"
    )


def _flag(key: str) -> str:
    """How a recorded argument is named in a message: as its flag, or in words for what the run found (how many
    images the data held, the precision --precision chose)."""
    return key.replace("_", " ") if key in ("images", "precision_used", "weights_id") else f"--{key.replace('_', '-')}"


def record_args(out: Path, recorded: dict[str, Any]) -> None:
    write_atomic(out / ARGS_FILE, json.dumps(recorded, indent=1).encode())


def write_atomic(path: Path, data: bytes) -> None:
    """`data` to `path` by a rename (`cait.checkpoint.atomic_write`): a reader (or a kill) never sees half a file."""
    atomic_write(path, lambda f: f.write(data))


def merging_bar(what: str, steps: int) -> tqdm:
    """The progress bar of a run's last phase (rank 0's), the shards merged into the run's files, in `steps`
    steps: named, so that the command line and the app's progress (which follows tqdm) say what the phase is
    rather than a bare time. what: the run's name ("atlas", "compare")."""
    return tqdm(total=steps, unit="step", desc=f"{what}: merging the shards into its files", file=sys.stderr)


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


def _skip_reasons(data: Dataset, skipped: np.ndarray) -> np.ndarray:
    """Why each skipped image could not be read (`ImageSet.skip_reason`; "" for a dataset that cannot say), kept
    in its shard so that a rerun can tell a file that still fails the same way from one to retry."""
    reason = getattr(data, "skip_reason", None)
    return np.array([(reason(i) or "") if reason else "" for i in skipped.tolist()], dtype=str)


def run_shards(
    model: nn.Module,
    data: Dataset,
    todo: list[range],
    out: Path,
    cover: Cover,
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
    """Compute and write the shards of image ranges `todo`, at most `stop_after` of them; data yields
    unnormalised (pixels, label, box, index, ok) items (`cait.data.read_images(..., normalise=False)`).
    patching: (corruption, severity) to patch each image's predicted class into its corrupted twin."""
    todo = todo[:stop_after]
    with tqdm(total=sum(len(r) for r in todo), unit="img", desc="atlas", disable=not show, file=sys.stderr) as bar:
        for images in todo:
            loader = DataLoader(Subset(data, images), batch_size=batch_size, num_workers=workers)
            numbers = dict(knockouts=knockouts, patching=patching, dtype=dtype, device=device, bar=bar)
            parts = list(_shard_numbers(model, loader, **numbers))
            keys = {k for p in parts for k in p}
            arrays = {k: np.concatenate([p[k] for p in parts if k in p]) for k in keys}
            arrays[SKIP_REASONS] = _skip_reasons(data, arrays["skipped"])
            write_shard(shard_path(out, images), arrays, cover.meta(images))
