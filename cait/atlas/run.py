"""One atlas run: load the model and the images, compute this rank's shards, and (rank 0, after every rank is
done) merge them into the atlas's files."""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from filelock import FileLock

from .. import explain
from ..data import DataWarning, ImageSet, read_from_flags
from ..distributed import RankFailed, balanced_runs, gather_all, process_group, rank_zero_does
from ..errors import InputError
from ..explain.causal import block_gamma_mean_abs
from ..explain.head_stats import uniform_attention_distance
from ..factory import load_from_flags
from ..outputs import writable_folder, write_failure
from ..preprocess import class_names
from ..provenance import SourcedModel
from ..runtime import choose_precision
from . import report
from .options import AtlasOptions
from .outdir import lock_out
from .page import write_page
from .shards import (
    FORMAT,
    SHARD_DIR,
    Cover,
    ShardError,
    args_problem,
    merging_bar,
    record_args,
    run_shards,
    shard_files,
    tiling,
    todo_images,
    verified,
)

# arguments that do not change the numbers, so a resumed run may differ in them (exemplars: only the page)
FREE_ARGS = ("out", "device", "workers", "stop_after", "threads", "remeasure_precision", "exemplars")


class AtlasError(InputError):
    """An atlas that cannot be made as asked; the message is one line."""


def recorded_args(options: AtlasOptions) -> dict[str, Any]:
    """The options that change the numbers, and the shards' format, as atlas_args.json holds them (JSON's types:
    a tuple is a list, a path a string); the keys are the command line's flags (AtlasOptions' fields)."""
    kept = {k: _plain(v) for k, v in sorted(asdict(options).items()) if k not in FREE_ARGS}
    return json.loads(json.dumps({"format": FORMAT, **kept}))


def _plain(value: Any) -> Any:
    """A path as the text the command line gave; everything else as it is (JSON turns a tuple into a list)."""
    return str(value) if isinstance(value, Path) else value


def barrier() -> None:
    """Every rank waits here for the others (nothing without a process group)."""
    if dist.is_initialized():
        dist.barrier()


def ready_out(out: Path, *, what: str = "atlas") -> FileLock | None:
    """Rank 0 makes OUT and its shards folder, proves them writable and locks OUT before any work (the others
    wait for the answer, an OutputError on every rank); returns the held lock (None on the other ranks). what:
    the kind of run, as a refusal names it."""

    def ready() -> FileLock:
        writable_folder(out / SHARD_DIR)
        return lock_out(out, what=what)

    return rank_zero_does(ready)


def plan_shards(
    out: Path,
    cover: Cover,
    recorded: dict,
    *,
    world: int,
    size: int,
    batch: int,
    error: type[InputError] = AtlasError,
    skip_reason: Callable | None = None,
    what: str = "atlas",
) -> list[list[range]]:
    """Rank 0 checks the arguments and the shards on disk (a damaged or foreign shard is redone, skips are
    retried unless they fail again alike: `shards.verified`, asking `skip_reason`) and splits what is left over
    the ranks, saying the split; every rank gets rank 0's plan, or its `error` (AtlasError; a comparison run
    raises its own, and `what` names it in the lines)."""

    def plan() -> list[list[range]]:
        problem = args_problem(out, recorded, what=what)
        if problem:
            raise error(problem)
        record_args(out, recorded)
        say = lambda line: print(line, file=sys.stderr)  # noqa: E731
        todo = todo_images(verified(out, cover, say=say, skip_reason=skip_reason), len(cover.paths))
        _say_resumed(len(cover.paths), len(todo))
        runs = balanced_runs(todo, world, size, batch=batch)
        if world > 1 and todo:
            split = ", ".join(
                f"rank {r}: {sum(map(len, rs))} images in {len(rs)} shard(s)" for r, rs in enumerate(runs)
            )
            print(f"{len(todo)} images to do over {world} processes ({split})", file=sys.stderr)
        return runs

    return gather_all(rank_zero_does(plan))[0]


def _say_resumed(images: int, todo: int) -> None:
    """A line when the shards on disk already hold some of the images: the run continues an earlier one."""
    if todo == 0:
        print(f"all {images} images were done before: merging", file=sys.stderr)
    elif todo < images:
        print(f"continuing: {images - todo} of {images} images were done before, {todo} to do", file=sys.stderr)


@contextmanager
def one_line_warnings(*, rank: int) -> Iterator[None]:
    """Inside, a `DataWarning` (data used, not all as asked) prints as one line, without the source line
    Python adds, and only on rank 0 (every rank reads the same data: one says it)."""
    with warnings.catch_warnings():
        if rank:
            warnings.simplefilter("ignore", DataWarning)
        shown = warnings.formatwarning

        def one_line(message, category, filename, lineno, line=None) -> str:
            if issubclass(category, DataWarning):
                return f"warning: {message}\n"
            return shown(message, category, filename, lineno, line)

        warnings.formatwarning = one_line
        try:
            yield
        finally:
            warnings.formatwarning = shown


def read_data(options: AtlasOptions, cfg) -> ImageSet:
    """The images `options` ask for (data, boxes, limit, sample), as the atlas reads them (not normalised)."""
    return read_from_flags(options, cfg, normalise=False)


def run(options: AtlasOptions) -> Path:
    """Make the atlas `options` ask for in options.out, loading its model and images (`make` does the rest); under
    torchrun this process is one rank of it. Raises `AtlasError` (and the reader's / loader's one-line errors,
    `OutputError` for an output that cannot be written) for input that cannot work."""
    if options.threads:
        torch.set_num_threads(options.threads)
    with process_group(options.device) as (rank, world, device):
        loaded = load_from_flags(options)
        loaded.model.to(device).eval()
        with one_line_warnings(rank=rank):
            data = read_data(options, loaded.model.cfg)
        return make(options, loaded, data, device=device, rank=rank, world=world)


def make(
    options: AtlasOptions,
    loaded: SourcedModel,
    data: ImageSet,
    *,
    device: torch.device,
    rank: int = 0,
    world: int = 1,
) -> Path:
    """The atlas `options` ask for in options.out, of `loaded`'s model (on `device`, in eval mode) over `data` (read
    with normalise=False), both given by the caller: the command line loads them (`run`), the app takes the model
    from its cache. Rank `rank` of `world` computes its shards; rank 0 merges them once all are done.

    Args:
        options: what to make (`AtlasOptions`: the command line's flags), which the atlas records.
        loaded: the model with the record of where its weights came from.
        data: the images, as `cait.data.read_images` reads options.data.
        device: where the model is.
        rank: this process's rank under torchrun (0 alone).
        world: the number of ranks (1 alone).

    Returns:
        The atlas's folder, options.out."""
    out = Path(options.out)
    lock = ready_out(out)  # after the input is known good (no folder made for a typo), before any work
    try:
        precision = choose_precision(options.precision, device, remeasure=options.remeasure_precision)
        # what auto chose is recorded too: shards of one atlas all come from one precision
        # and the weights' identity: a file trained again at the same path is another model, never continued
        recorded = recorded_args(options) | {"images": len(data), "precision_used": precision.name}
        recorded["weights_id"] = loaded.weights_id
        cover = Cover.of(recorded, data.paths)
        sizes = dict(world=world, size=options.shard_size, batch=options.batch_size)
        plan = plan_shards(out, cover, recorded, **sizes, skip_reason=data.skip_reason)
        dtype = precision.dtype
        passes = dict(batch_size=options.batch_size, workers=options.workers, knockouts=options.knockouts, dtype=dtype)
        passes["patching"] = options.patching
        show = rank == 0
        run_shards(
            loaded.model,
            data,
            plan[rank],
            out,
            cover,
            device=device,
            show=show,
            stop_after=options.stop_after,
            **passes,
        )
        barrier()  # every rank's shards are on disk before rank 0 looks
        if rank == 0:
            done = shard_files(out)
            files = tiling(done, len(data))
            if files is None:
                left = len(todo_images(list(done), len(data)))
                print(f"stopped with {left} of {len(data)} images to do: the same command continues", file=sys.stderr)
            else:
                merge(out, loaded, data, files, options=options, dtype=dtype)
        return out
    finally:
        if lock is not None:
            lock.release()


MERGE_STEPS = 5  # `_write_merged`'s: images.csv, heads.csv, summary.json, the histograms, atlas.html
MERGED = ("images.csv", "skipped.csv", "heads.csv", "images.parquet", "heads.parquet", "summary.json", "atlas.html")


def merge(out: Path, loaded: SourcedModel, data, shards: list[Path], *, options: AtlasOptions, dtype) -> None:
    """images.csv (and skipped.csv beside it), heads.csv, summary.json (and parquet copies), then atlas.html,
    from the shard files in image order. Every file is written in a staging folder and renamed into OUT when all
    are done: a failure midway leaves OUT's files as they were, never half written. Raises AtlasError, naming
    the files and why (skipped.csv), when no image could be read."""
    stage = out / ".merging"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        try:
            with merging_bar("atlas", MERGE_STEPS) as bar:
                skipped, said = _write_merged(
                    stage, loaded, data, shards, options=options, dtype=dtype, step=bar.update
                )
            if said:  # after the bar's last line, not on it
                print(said, file=sys.stderr)
        except OSError as e:  # a write() on a full disk names no file: name the atlas's folder
            if e.filename is None and e.strerror:
                raise OSError(e.errno, f"{e.strerror} (writing the merged files)", str(out)) from None
            raise
        readable = len(skipped) < len(data)
        for name in MERGED if readable else ("skipped.csv",):
            if (stage / name).exists():
                os.replace(stage / name, out / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if not readable:
        _refuse_unreadable(out, skipped)
    print(f"wrote images.csv, heads.csv, summary.json and atlas.html to {out}", file=sys.stderr)


def _write_merged(
    out: Path, loaded: SourcedModel, data, shards: list[Path], *, options: AtlasOptions, dtype, step: Callable
) -> tuple[list[tuple[str, str]], str | None]:
    """The merged files into `out`; the skipped images and why, and the line saying what the boxes scored (None
    without boxes). Of data with no readable image, only images.csv and skipped.csv. step: called after each of
    the MERGE_STEPS steps done."""
    model, cfg = loaded.model, loaded.model.cfg
    boxes = data.boxes is not None
    blocks = explain.causal.block_names(model) if options.knockouts else None
    names = list(class_names(cfg))
    tally = report.Tally(cfg.depth_token_only, cfg.num_heads, cfg.num_classes, options.exemplars)
    patched = explain.causal.block_names(model) if options.patching else None
    report.write_images_csv(
        out / "images.csv",
        shards,
        paths=data.paths,
        names=names,
        tally=tally,
        boxes=boxes,
        blocks=blocks,
        patched=patched,
    )
    skipped = [(data.paths[i], data.skip_reason(i) or "unreadable") for i in sorted(tally.skipped)]
    report.write_skipped_csv(out / "skipped.csv", skipped)
    step()
    if len(skipped) == len(data):
        return skipped, None
    report.write_csv(out / "heads.csv", report.head_rows(tally, names, boxes=boxes))
    for name in ("images.csv", "heads.csv"):
        report.write_parquet(out / name)
    step()
    precision = "fp32" if dtype is None else "bf16"
    summary = _summary(tally, loaded, data, blocks, boxes=boxes, precision=precision, patching=options.patching)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    step()
    hist = report.histograms(shards, tally, boxes=boxes)
    step()
    page = dict(model=model, data=data, names=names, dtype=dtype, skipped=skipped)
    write_page(out / "atlas.html", summary, tally, hist, **page)
    step()
    return skipped, report.box_line(summary["boxes"]) if boxes else None


def _refuse_unreadable(out: Path, skipped: list[tuple[str, str]]) -> None:
    """AtlasError (one line, every file and why up to a few, the rest in skipped.csv): every image was skipped,
    and an atlas of nothing is an error, not a page."""
    shown = "; ".join(f"{p}: {why}" for p, why in skipped[:4])
    more = f"; and {len(skipped) - 4} more" if len(skipped) > 4 else ""
    raise AtlasError(
        f"none of the {len(skipped)} images could be read ({shown}{more}); the list is in {out}/skipped.csv"
    )


def _summary(
    tally: report.Tally,
    loaded: SourcedModel,
    data,
    blocks: list[str] | None,
    *,
    boxes: bool,
    precision: str,
    patching: tuple[str, int] | None = None,
) -> dict:
    cfg = loaded.model.cfg
    images = int(tally.moments["probability"].n) if "probability" in tally.moments else 0
    distance = tally.moments.get("distance")
    summary: dict[str, Any] = {
        "data": data.name,
        "model": loaded.made_from,
        "images": images,
        "skipped": [data.paths[i] for i in sorted(tally.skipped)],
        "top1": tally.correct / tally.labelled if tally.labelled else None,
        "labelled": tally.labelled,
        "precision": precision,
        "dla": "each CA head's direct write to the logit of the class the model predicted (cait.explain)",
        "heads": report.head_entries(tally, data.paths, boxes=boxes) if images else [],
        "sa_attention_distance": None,
        "boxes": report.box_entry(tally, data.box_count, data.boxes.numpy()) if boxes else None,
        **report.class_entries(tally, list(class_names(cfg))),
    }
    if distance is not None:
        summary["sa_attention_distance"] = {
            "per_head_px": distance.mean.tolist(),  # [SA layer][head], from 0
            "head_mean_by_depth_px": distance.mean.mean(1).tolist(),
            "uniform_px": uniform_attention_distance(cfg.grid_size, cfg.patch_size),
        }
    if blocks is not None and images:
        gamma = block_gamma_mean_abs(loaded.model).tolist()
        summary["blocks"] = report.block_entries(tally, blocks, gamma)
    if patching is not None and images:
        summary["patching"] = report.patching_entry(tally, explain.causal.block_names(loaded.model), patching)
    return summary


def main_guarded(options: AtlasOptions) -> int:
    """`run`, with bad input and file-system errors as one line on stderr (input errors from rank 0 only under
    torchrun) and exit code 2; Ctrl-C as a line saying how to continue and exit code 130."""
    return guarded(lambda: run(options), "python -m cait.atlas", options.out)


def guarded(work: Callable[[], object], prog: str, out: str | Path) -> int:
    """`work()` of a sharded command (`prog`, as its error lines name it, writing into `out`): bad input and
    file-system errors as one line on stderr (input errors from rank 0 only under torchrun) and exit code 2; Ctrl-C
    as a line saying how to continue and exit code 130; 0 when it is done."""
    try:
        work()
    except RankFailed:  # rank 0 says what failed, with its traceback
        return 1
    except KeyboardInterrupt:
        if int(os.environ.get("RANK", "0")) == 0:
            print("\ninterrupted: the shards written are kept; the same command continues", file=sys.stderr)
        return 130
    except OSError as e:  # a full disk, a folder made read-only mid-run: this rank's own problem, said by it
        kept = "; the shards written are kept" if any((Path(out) / SHARD_DIR).glob("shard-*.npz")) else ""
        print(f"{prog}: error: {write_failure(e)}{kept}", file=sys.stderr)
        return 2
    except (InputError, ShardError) as e:  # a flag, file, model, image set or shard that cannot work
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    return 0


def _one_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__
