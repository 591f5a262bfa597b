"""One comparison run: load both models and the images (each model through its own preprocessing), compute this
rank's shards with the atlas's shard machinery (`cait.atlas.shards`: what a shard covers, its checksum, the
resume; `cait.atlas.run`: the locked output folder and the plan over the ranks), and (rank 0, once every rank is
done) merge them into the run's files, each written whole or not at all."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

import numpy as np
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from ..atlas.report import write_csv
from ..atlas.run import barrier, guarded, plan_shards, ready_out
from ..atlas.shards import FORMAT, Cover, shard_files, shard_path, tiling, todo_images, write_shard
from ..data import ImageSet, read_images
from ..distributed import process_group
from ..errors import InputError
from ..explain.causal import block_names
from ..explain.metrics import head_row
from ..factory import load_from_flags
from ..preprocess import class_names
from ..provenance import SourcedModel
from . import report
from .compute import PairedImages, pair_numbers
from .files import FILES
from .heads import match_heads
from .options import CompareOptions, Side
from .page import write_page

Progress = Callable[[int, int], None]  # (images done, images to do) of this run
# What a comparison's shards hold and mean, recorded beside the atlas's shard FORMAT; bumped when it changes.
COMPARE_FORMAT = 1
FREE = ("out", "device", "workers", "stop_after", "exemplars")  # options that do not change the numbers


class CompareError(InputError):
    """A comparison that cannot be made as asked; the message is one line."""


class CompareStopped(Exception):
    """The run was asked to stop (`should_stop`); the shards written are kept and the same options continue."""


def load_side(side: Side, which: str) -> SourcedModel:
    """Model `which` ("A" or "B") through the one door, as the command line's flags load it. Raises
    CompareError for a side with neither a variant nor a checkpoint, and the loader's one-line errors."""
    if side.model is None and side.checkpoint is None:
        flag = which.lower()
        raise CompareError(f"model {which} is missing: give --model-{flag} VARIANT or --checkpoint-{flag} FILE")
    return load_from_flags(argparse.Namespace(**dataclasses.asdict(side)))


def check_comparable(a: SourcedModel, b: SourcedModel) -> list[str]:
    """The two models' shared class names; CompareError when they differ (their answers cannot be compared)."""
    names_a, names_b = list(class_names(a.model.cfg)), list(class_names(b.model.cfg))
    if names_a != names_b:
        raise CompareError(
            f"the two models answer different classes ({len(names_a)} classes, first {names_a[:3]}, against "
            f"{len(names_b)}, first {names_b[:3]}): their answers cannot be compared"
        )
    return names_a


def recorded_options(options: CompareOptions, images: int) -> dict:
    """What changes the numbers, as the run's arguments file holds it (JSON's types)."""
    kept = {k: v for k, v in dataclasses.asdict(options).items() if k not in FREE}
    return json.loads(json.dumps({"format": FORMAT, "compare_format": COMPARE_FORMAT, **kept, "images": images}))


def run_compare(
    options: CompareOptions, *, progress: Progress | None = None, should_stop: Callable[[], bool] | None = None
) -> Path:
    """Compare model A with model B over the images `options` ask for, writing the run's files to options.out
    (`cait.compare.files`); under torchrun this process is one rank of the run.

    Args:
        options: what to compare, over what, where to (`CompareOptions`).
        progress: called after each batch with (images done, images to do) of this process.
        should_stop: called before each batch; a true answer ends the run there (`CompareStopped`), the shards
            written kept: the same options continue. An exception it raises ends the run the same way.

    Returns:
        options.out (its files are complete when every shard is done; `read_run` reads them).

    Raises:
        CompareError (and the loader's, the reader's one-line `InputError`s): input that cannot work, before any
        file is written.
    """
    with process_group(options.device) as (rank, world, device):
        loaded = [load_side(options.a, "A"), load_side(options.b, "B")]
        names = check_comparable(*loaded)
        for side in loaded:
            side.model.to(device).eval()
        data = [_read(options, side.model.cfg) for side in loaded]
        return _make(options, loaded, data, names, device=device, rank=rank, world=world, hooks=(progress, should_stop))


def _read(options: CompareOptions, cfg) -> ImageSet:
    return read_images(
        options.data, cfg, boxes=options.boxes, limit=options.limit, sample=options.sample, normalise=False
    )


def _make(options, loaded, data, names, *, device, rank, world, hooks) -> Path:
    """Lock OUT, plan, compute this rank's shards and (rank 0) merge once all are done."""
    out = Path(options.out)
    lock = ready_out(out)
    try:
        recorded = recorded_options(options, len(data[0]))
        cover = Cover.of(recorded, data[0].paths)
        plan = plan_shards(
            out, cover, recorded, world=world, size=options.shard_size, batch=options.batch_size, error=CompareError
        )
        paired = PairedImages(*data)
        todo = plan[rank][: options.stop_after]
        _run_shards(loaded, paired, todo, out, cover, options=options, device=device, show=rank == 0, hooks=hooks)
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


def _run_shards(loaded, paired, todo, out, cover, *, options, device, show, hooks) -> None:
    """Compute and write the shards of image ranges `todo`, batch by batch (each batch one CKA minibatch)."""
    progress, should_stop = hooks
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
    """The run's files from the shards in image order, written in a staging folder and renamed into OUT when all
    are done: a failure midway leaves OUT's files as they were."""
    stage = out / ".merging"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        arrays = report.merged(shards, cover)
        if not len(arrays.get("index", [])):
            raise CompareError(f"none of the {len(data[0])} images could be read by both models")
        summary, rows = _write_files(stage, loaded, data, names, arrays, options=options)
        write_page(stage / "compare.html", summary, rows, loaded, data, exemplars=options.exemplars)
        for name in (*FILES, "compare.html"):
            os.replace(stage / name, out / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    print(f"wrote compare.html, cka.csv, heads.csv, classes.csv and summary.json to {out}", file=sys.stderr)


def _side(loaded: SourcedModel, data: ImageSet, arrays: dict, key: str) -> dict:
    cfg = loaded.model.cfg
    chance = arrays.get(f"{key}_box_share")
    return {
        "model": loaded.made_from + ("" if loaded.trained else f" (RANDOM INIT: {loaded.notice})"),
        "blocks": block_names(loaded.model),
        "heads": [list(h) for h in report.heads_of(cfg)],
        "img_size": cfg.img_size,
        "grid": cfg.grid_size,
        "chance": None if chance is None or np.isnan(chance).all() else float(np.nanmean(chance)),
    }


def _write_files(stage: Path, loaded, data, names, arrays, *, options) -> tuple[dict, dict[str, list[dict]]]:
    """cka.csv, head_similarity.csv, heads.csv, classes.csv, disagreements.csv and summary.json into `stage`;
    returns the summary and the rows of heads, classes and disagreements (for the page)."""
    a, b = (_side(side, d, arrays, k) for side, d, k in zip(loaded, data, "ab"))
    sums = report.cka_sums(arrays, len(a["blocks"]), len(b["blocks"]))
    cka = sums.cka()
    write_csv(stage / "cka.csv", report.matrix_rows(cka, a["blocks"], b["blocks"], "block_a"))
    similarity = report.head_matrix(arrays, len(a["heads"]), len(b["heads"]))
    labels_a = [head_row(l - 1, h - 1) for l, h in a["heads"]]
    labels_b = [head_row(l - 1, h - 1) for l, h in b["heads"]]
    write_csv(stage / "head_similarity.csv", report.matrix_rows(similarity, labels_a, labels_b, "head_a"))
    matching = match_heads(similarity)
    numbers = [report.side_heads(arrays, k, side["grid"]) for k, side in zip("ab", (a, b))]
    heads = report.matched_rows(matching, a["heads"], b["heads"], *numbers)
    write_csv(stage / "heads.csv", heads)
    said = report.answers(arrays, names, data[0].paths)
    rows = {"heads": heads, "classes": said.pop("classes"), "disagreements": said.pop("disagreements")}
    for name in ("classes", "disagreements"):
        write_csv(stage / f"{name}.csv", rows[name])
    summary = {
        "data": data[0].name,
        "images": int(len(arrays["index"])),
        "skipped": [data[0].paths[int(i)] for i in arrays.get("skipped", [])],
        "a": a,
        "b": b,
        "cka": {"minibatches": sums.batches, "batch_size": options.batch_size, "matrix": _listed(cka)},
        "head_similarity": _listed(similarity),
        "matching": [
            {"head_a": a["heads"][i], "head_b": b["heads"][j], "similarity": s, "numbers": heads[k]}
            for k, (i, j, s) in enumerate(matching)
        ],
        **said,
    }
    (stage / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary, rows


def _listed(matrix: np.ndarray) -> list[list[float | None]]:
    """A matrix as JSON lists, NaN as null (strict JSON has no NaN)."""
    return [[None if np.isnan(v) else float(v) for v in row] for row in matrix]


def main_guarded(options: CompareOptions) -> int:
    """`run_compare` as the command runs it: bad input one line and exit code 2, Ctrl-C exit code 130
    (`cait.atlas.run.guarded`)."""
    return guarded(lambda: run_compare(options), "python -m cait.compare")
