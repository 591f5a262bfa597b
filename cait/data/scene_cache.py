"""A disk cache of rendered Fashion-MNIST scenes: each split is rendered once into a uint8 [n, canvas,
canvas, 3] `.npy` file that every later run, DataLoader worker and torchrun rank memory-maps (the page
cache holds one copy for all of them).

The file name carries a hash of everything the pixels depend on (`FashionMNISTScenes.generator_params`:
canvas, seed, split, n, garment size range, the generator's version and a digest of the source
garments), so a change to any of them renders a new file and the stale one is removed. A subset of n
scenes has a file of its own (n in its name), holding the whole split's first n scenes. A build writes a
temporary file and renames it, under a lock: an interrupted build never leaves a file that is taken
for complete, and parallel processes wait for one build instead of racing.

Where: cait-lens's user cache, `cait.runtime.user_cache_dir` ($CAIT_LENS_CACHE if set, else
$XDG_CACHE_HOME/cait-lens, else ~/.cache/cait-lens).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from filelock import FileLock
from tqdm import tqdm

from ..runtime import CACHE_ENV, user_cache_dir
from .names import DataError

if TYPE_CHECKING:
    from .scenes import FashionMNISTScenes

CHUNK = 500  # scenes per task when rendering in several processes
PARALLEL_FROM = 4000  # below this many scenes, starting processes costs more than it saves


def cache_path(scenes: "FashionMNISTScenes") -> Path:
    """The file holding these scenes: readable prefix (what it is) + hash (exactly which pixels)."""
    params = scenes.generator_params()
    params["garments_sha256"] = hashlib.sha256(np.ascontiguousarray(scenes.garments).tobytes()).hexdigest()
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    return user_cache_dir() / f"{_prefix(scenes)}-{digest}.npy"


def lock_path(path: Path) -> Path:
    """The lock file that guards building `path`."""
    return path.with_name(path.name + ".lock")


def _prefix(scenes: "FashionMNISTScenes") -> str:
    # the style before the seed: a glob for one style's stale files never matches another style's files
    return f"scenes-{scenes.split}{scenes.style_tag}-seed{scenes.seed}-{scenes.canvas}px-n{len(scenes)}"


def cached_pixels(scenes: "FashionMNISTScenes", *, processes: int | None = None) -> np.ndarray:
    """Every scene of `scenes` as a read-only memory-mapped uint8 [n, canvas, canvas, 3] array, rendered
    (with a progress bar) on first use. processes: rendering processes (default: up to 2 CPUs)."""
    path = cache_path(scenes)
    shape = (len(scenes), scenes.canvas, scenes.canvas, 3)
    _remove_orphans(path.parent)
    pixels = _open(path, shape)
    if pixels is not None:
        return pixels
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(lock_path(path)):
            pixels = _open(path, shape)  # another process may have built it while this one waited
            if pixels is None:
                _build(scenes, path, shape, processes)
                _remove_stale(path, _prefix(scenes))
                pixels = _open(path, shape)
    except OSError as e:
        raise DataError(
            f"cannot write the scene cache in {path.parent} ({e.strerror or e}); "
            f"set {CACHE_ENV} to a writable directory"
        ) from None
    if pixels is None:
        raise DataError(f"the scene cache {path} was written but cannot be read back; delete it and retry")
    return pixels


def _open(path: Path, shape: tuple[int, ...]) -> np.ndarray | None:
    """The finished file as a memory map, or None when it is absent or not what it should be."""
    try:
        pixels = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return None
    return pixels if pixels.shape == shape and pixels.dtype == np.uint8 else None


def _remove_orphans(folder: Path) -> None:
    """Temporary files of builds whose process is gone (killed mid-render: its file can be hundreds of MB).
    A live build's file is left alone: its process id, in the name, still runs."""
    for tmp in folder.glob("scenes-*.npy.tmp*"):
        pid = tmp.name.rsplit(".tmp", 1)[1]
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _build(scenes: "FashionMNISTScenes", path: Path, shape: tuple[int, ...], processes: int | None) -> None:
    needed = int(np.prod(shape)) + 4096
    free = shutil.disk_usage(path.parent).free
    if free < needed:
        raise DataError(
            f"the cache of {scenes.name} needs {needed / 2**20:.0f} MB in {path.parent}, "
            f"{free / 2**20:.0f} MB are free; free space or set {CACHE_ENV}"
        )
    for leftover in path.parent.glob(path.name + ".tmp*"):  # an interrupted build's; we hold the lock
        leftover.unlink(missing_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
        with tqdm(
            total=shape[0],
            desc=f"rendering {scenes.name} into {path.parent}",
            unit="scene",
            file=sys.stderr,
            mininterval=1.0,
            dynamic_ncols=True,
        ) as bar:
            for start, chunk in _render_chunks(scenes, processes):
                out[start : start + len(chunk)] = chunk
                bar.update(len(chunk))
        out.flush()
        del out
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _render_chunks(scenes: "FashionMNISTScenes", processes: int | None):
    """(first index, uint8 [k, canvas, canvas, 3]) for consecutive chunks covering every scene."""
    n = len(scenes)
    starts = range(0, n, CHUNK)
    if processes is None:
        processes = min(2, len(os.sched_getaffinity(0)))
    # a daemonic process (a DataLoader worker) may not start children
    if processes <= 1 or n < PARALLEL_FROM or multiprocessing.current_process().daemon:
        for start in starts:
            yield start, _render_range(scenes, start, min(start + CHUNK, n))
        return
    # spawn, not fork: the parent may hold torch's thread pools, which a forked child can deadlock on
    with ProcessPoolExecutor(
        processes,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(scenes, os.getpid()),
    ) as pool:
        yield from zip(starts, pool.map(_render_in_worker, starts, [min(s + CHUNK, n) for s in starts]))


def _render_range(scenes: "FashionMNISTScenes", start: int, stop: int) -> np.ndarray:
    return np.stack([scenes.render(i) for i in range(start, stop)])


_worker_scenes: "FashionMNISTScenes | None" = None


def _init_worker(scenes: "FashionMNISTScenes", parent: int) -> None:
    global _worker_scenes
    _worker_scenes = scenes
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _exit_with(parent: int) -> None:
    """End this render worker when its parent is gone (killed: nothing told the pool to stop), instead of
    rendering on, orphaned, for nobody."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _render_in_worker(start: int, stop: int) -> np.ndarray:
    return _render_range(_worker_scenes, start, stop)


def _remove_stale(current: Path, prefix: str) -> None:
    """Files of the same scenes made by other generator parameters, and their lock files: never used
    again. (A process that still maps one keeps its pages; on POSIX unlinking does not pull them away.
    The current file's lock stays: filelock leaves it by design, as deleting a lock races its users.)"""
    for old in current.parent.glob(f"{prefix}-*.npy"):
        if old != current:
            old.unlink(missing_ok=True)
            lock_path(old).unlink(missing_ok=True)
