"""One comparison run: load both models and the images (each model through its own preprocessing), compute this
rank's shards with the atlas's shard machinery (`cait.atlas.shards`: what a shard covers, its checksum, the
resume; `cait.atlas.run`: the locked output folder and the plan over the ranks), and (rank 0, once every rank is
done) merge them into the run's files, each written whole or not at all."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from ..atlas.run import barrier, guarded, plan_shards, ready_out
from ..atlas.shards import FORMAT, Cover, merging_bar, shard_files, shard_path, tiling, todo_images, write_shard
from ..data import ImageSet, read_images
from ..distributed import process_group
from ..factory import load_from_flags
from ..provenance import SourcedModel
from . import report
from .atlases import compare_atlases
from .compute import PairedImages, pair_numbers
from .merge import write_merged
from .options import CompareError, CompareOptions, Side, check_comparable

Progress = Callable[[int, int], None]  # (images done, images to do) of this run
# What a comparison's shards hold and mean, recorded beside the atlas's shard FORMAT; bumped when it changes.
COMPARE_FORMAT = 1
FREE = (
    "out",
    "device",
    "workers",
    "stop_after",
    "exemplars",
    "atlas_a",
    "atlas_b",
)  # options that do not change the numbers


class CompareStopped(Exception):
    """The run was asked to stop (`should_stop`); the shards written are kept and the same options continue."""


def load_side(side: Side, which: str) -> SourcedModel:
    """Model `which` ("A" or "B") through the one door, as the command line's flags load it. Raises
    CompareError for a side with neither a variant nor a checkpoint, and the loader's one-line errors."""
    if side.model is None and side.checkpoint is None:
        flag = which.lower()
        raise CompareError(f"model {which} is missing: give --model-{flag} VARIANT or --checkpoint-{flag} FILE")
    return load_from_flags(argparse.Namespace(**dataclasses.asdict(side)))


def recorded_options(options: CompareOptions, images: int) -> dict:
    """What changes the numbers, as the run's arguments file holds it (JSON's types)."""
    kept = {k: v for k, v in dataclasses.asdict(options).items() if k not in FREE}
    return json.loads(json.dumps({"format": FORMAT, "compare_format": COMPARE_FORMAT, **kept, "images": images}))


def run_compare(
    options: CompareOptions,
    *,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    models: tuple[SourcedModel, SourcedModel] | None = None,
) -> Path:
    """Compare model A with model B over the images `options` ask for, writing the run's files to options.out
    (`cait.compare.files`); under torchrun this process is one rank of the run.

    Args:
        options: what to compare, over what, where to (`CompareOptions`).
        progress: called after each batch with (images done, images to do) of this process.
        should_stop: called before each batch; a true answer ends the run there (`CompareStopped`), the shards
            written kept: the same options continue. An exception it raises ends the run the same way.
        models: models A and B already loaded (an app's cache holds them: no second copy in memory), used
            instead of loading options.a and options.b, which the run still records: they must name these models.

    Returns:
        options.out (its files are complete when every shard is done; `read_run` reads them).

    Raises:
        CompareError (and the loader's, the reader's one-line `InputError`s): input that cannot work, before any
        file is written.
    """
    _check(options)
    if options.atlas_a is not None:
        return compare_atlases(options)
    with process_group(options.device) as (rank, world, device):
        loaded = list(models) if models is not None else [load_side(options.a, "A"), load_side(options.b, "B")]
        names = check_comparable(*(side.model for side in loaded))
        for side in loaded:
            side.model.to(device).eval()
        data = [_read(options, side.model.cfg) for side in loaded]
        return _make(
            options, loaded, data, names, device=device, rank=rank, world=world, callbacks=(progress, should_stop)
        )


def _check(options: CompareOptions) -> None:
    """CompareError for options that ask for no comparison or two kinds at once."""
    atlases = (options.atlas_a is not None) + (options.atlas_b is not None)
    if options.out is None:
        raise CompareError("no output folder: give --out")
    if atlases == 1:
        raise CompareError("give both --atlas-a and --atlas-b, or neither")
    models = any(dataclasses.astuple(options.a)) or any(dataclasses.astuple(options.b)) or options.data is not None
    if atlases and models:
        raise CompareError("give two atlases (--atlas-a, --atlas-b) or two models and --data, not both")
    if not atlases and options.data is None:
        raise CompareError("no images: give --data (or two atlases of the same images, --atlas-a and --atlas-b)")


def _read(options: CompareOptions, cfg) -> ImageSet:
    return read_images(
        options.data, cfg, boxes=options.boxes, limit=options.limit, sample=options.sample, normalise=False
    )


def _make(
    options: CompareOptions,
    loaded: list[SourcedModel],
    data: list[ImageSet],
    names: list[str],
    *,
    device,
    rank: int,
    world: int,
    callbacks: tuple[Progress | None, Callable[[], bool] | None],
) -> Path:
    """Lock OUT, plan, compute this rank's shards and (rank 0) merge once all are done."""
    out = Path(options.out)
    lock = ready_out(out, what="comparison")
    try:
        recorded = recorded_options(options, len(data[0]))
        cover = Cover.of(recorded, data[0].paths)
        sizes = dict(world=world, size=options.shard_size, batch=options.batch_size)
        plan = plan_shards(out, cover, recorded, **sizes, error=CompareError, what="comparison")
        paired = PairedImages(*data)
        todo = plan[rank][: options.stop_after]
        _run_shards(
            loaded, paired, todo, out, cover, options=options, device=device, show=rank == 0, callbacks=callbacks
        )
        barrier()  # every rank's shards are on disk before rank 0 looks
        if rank == 0:
            files = tiling(shard_files(out), len(paired))
            if files is None:
                left = len(todo_images(list(shard_files(out)), len(paired)))
                print(f"stopped with {left} of {len(paired)} images to do: the same command continues", file=sys.stderr)
            else:
                merge(out, loaded, data, names, files, cover, options=options)
        return out
    finally:
        if lock is not None:
            lock.release()


def _run_shards(loaded, paired, todo, out, cover, *, options, device, show, callbacks) -> None:
    """Compute and write the shards of image ranges `todo`, batch by batch (each batch one CKA minibatch)."""
    progress, should_stop = callbacks
    total, done = sum(len(r) for r in todo), 0
    with tqdm(total=total, unit="img", desc="compare", disable=not show, file=sys.stderr) as bar:
        for images in todo:
            loader = DataLoader(Subset(paired, images), batch_size=options.batch_size, num_workers=options.workers)
            parts = []
            for batch in loader:
                if should_stop is not None and should_stop():
                    raise CompareStopped("stopped: the shards written are kept; the same options continue")
                parts.append(pair_numbers(loaded[0].model, loaded[1].model, batch, device=device))
                done += len(batch[5])
                bar.update(len(batch[5]))
                if progress is not None:
                    progress(done, total)
            keys = {k for p in parts for k in p}
            arrays = {k: np.concatenate([p[k] for p in parts if k in p]) for k in keys}
            write_shard(shard_path(out, images), arrays, cover.meta(images))


def merge(out: Path, loaded, data, names: list[str], shards: list[Path], cover: Cover, *, options) -> None:
    """The run's files from the shards in image order (`write_merged`), in two steps on a named progress bar."""
    with merging_bar("compare", 2) as bar:
        arrays = report.merged(shards, cover)
        if not len(arrays.get("index", [])):
            raise CompareError(f"none of the {len(data[0])} images could be read by both models")
        bar.update()
        write_merged(out, loaded, data, names, arrays, options=options)
        bar.update()


def main_guarded(options: CompareOptions) -> int:
    """`run_compare` as the command runs it: bad input one line and exit code 2, Ctrl-C exit code 130
    (`cait.atlas.run.guarded`)."""
    return guarded(lambda: run_compare(options), "python -m cait.compare", options.out)
