"""One atlas run: load the model and the images, compute this rank's shards, and (rank 0, after every rank is
done) merge them into the atlas's files."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .. import explain, factory
from ..data import DataError, read_images
from ..distributed import rank_shards, setup_distributed, shard_ranges
from ..errors import InputError
from ..preprocess import class_names
from ..provenance import SourcedModel
from ..runtime import DeviceError, choose_precision
from . import report
from .page import write_page
from .shards import args_problem, missing_shards, record_args, run_shards, write_atomic

# arguments that do not change the numbers, so a resumed run may differ in them (exemplars: only the page)
FREE_ARGS = ("out", "device", "workers", "stop_after", "threads", "remeasure_precision", "exemplars")


class AtlasError(InputError):
    """An atlas that cannot be made as asked; the message is one line."""


def load_model(args: argparse.Namespace) -> SourcedModel:
    """The model --model/--checkpoint/--pretrained/--random-init ask for, through `cait.load_model` (its
    default model and its policy for missing weights)."""
    try:
        loaded = factory.load_model(
            args.model, args.checkpoint, pretrained=args.pretrained, random_init=args.random_init
        )
    except (ValueError, TypeError) as e:  # a name or file that cannot work (CheckpointError is a ValueError)
        raise AtlasError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    if not loaded.trained:
        print(f"WARNING: {loaded.notice}; using RANDOM INIT (the atlas says so)", file=sys.stderr)
    return loaded


def recorded_args(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments that change the numbers, as atlas_args.json holds them (JSON's types: a tuple is a list)."""
    return json.loads(json.dumps({k: v for k, v in sorted(vars(args).items()) if k not in FREE_ARGS}))


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def run(args: argparse.Namespace) -> Path:
    """Make the atlas `args` ask for in args.out; under torchrun this process is one rank of it. Raises
    `AtlasError` (and the reader's / loader's one-line errors) for input that cannot work."""
    if args.threads:
        torch.set_num_threads(args.threads)
    rank, world, device = setup_distributed(args.device)
    try:
        loaded = load_model(args)
        model = loaded.model.to(device).eval()
        data = read_images(
            args.data, model.cfg, boxes=args.boxes, limit=args.limit, sample=args.sample, normalise=False
        )
        precision = choose_precision(args.precision, device, remeasure=args.remeasure_precision)
        # what auto chose is recorded too: shards of one atlas all come from one precision
        out, recorded = Path(args.out), recorded_args(args) | {"images": len(data), "precision_used": precision.name}
        problem = args_problem(out, recorded)  # every rank reads before rank 0 writes: they all agree
        _barrier()
        if problem:
            raise AtlasError(problem)
        if rank == 0:
            record_args(out, recorded)
        dtype = precision.dtype
        shards = shard_ranges(len(data), args.shard_size)
        mine = rank_shards(len(shards), rank, world)
        options = dict(batch_size=args.batch_size, workers=args.workers, knockouts=args.knockouts, dtype=dtype)
        options["patching"] = args.patching
        run_shards(model, data, shards, mine, out, device=device, show=rank == 0, stop_after=args.stop_after, **options)
        _barrier()
        missing = missing_shards(out, len(shards))
        if rank == 0 and missing:
            print(
                f"stopped with {len(missing)} of {len(shards)} shards to do: the same command continues",
                file=sys.stderr,
            )
        elif rank == 0:
            merge(out, loaded, data, len(shards), args=args, dtype=dtype)
        return out
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def merge(out: Path, loaded: SourcedModel, data, shards: int, *, args: argparse.Namespace, dtype) -> None:
    """images.csv (and skipped.csv beside it), heads.csv, summary.json (and parquet copies), then atlas.html,
    from the shards on disk. Raises AtlasError, naming the files and why, when no image could be read."""
    model, cfg = loaded.model, loaded.model.cfg
    boxes = data.boxes is not None
    blocks = explain.block_names(model) if args.knockouts else None
    names = list(class_names(cfg))
    tally = report.Tally(cfg.depth_token_only, cfg.num_heads, cfg.num_classes, args.exemplars)
    patched = explain.block_names(model) if args.patching else None
    report.write_images_csv(
        out / "images.csv",
        out,
        shards=shards,
        paths=data.paths,
        names=names,
        tally=tally,
        boxes=boxes,
        blocks=blocks,
        patched=patched,
    )
    skipped = [(data.paths[i], data.skip_reason(i) or "unreadable") for i in sorted(tally.skipped)]
    report.write_skipped_csv(out / "skipped.csv", skipped)
    _refuse_unreadable(out, skipped, images=len(data))
    report.write_csv(out / "heads.csv", report.head_rows(tally, names, boxes=boxes))
    for name in ("images.csv", "heads.csv"):
        report.write_parquet(out / name)
    precision = "fp32" if dtype is None else "bf16"
    summary = _summary(tally, loaded, data, blocks, boxes=boxes, precision=precision, patching=args.patching)
    summary |= {"skip_reasons": dict(skipped)}  # beside `skipped`, the paths evaluate's result names too
    write_atomic(out / "summary.json", json.dumps(summary, indent=1).encode())
    hist = report.histograms(out, shards, tally, boxes=boxes)
    write_page(out / "atlas.html", summary, tally, hist, model=model, data=data, names=names, dtype=dtype)
    if boxes:
        print(report.box_line(summary["boxes"]), file=sys.stderr)
    print(f"wrote images.csv, heads.csv, summary.json and atlas.html to {out}", file=sys.stderr)


def _refuse_unreadable(out: Path, skipped: list[tuple[str, str]], *, images: int) -> None:
    """AtlasError (one line, every file and why up to a few, the rest in skipped.csv) when every image was
    skipped: an atlas of nothing is an error, not a page."""
    if images and len(skipped) == images:
        shown = "; ".join(f"{p}: {why}" for p, why in skipped[:4])
        more = f"; and {len(skipped) - 4} more" if len(skipped) > 4 else ""
        raise AtlasError(f"none of the {images} images could be read ({shown}{more}); the list is in {out}/skipped.csv")


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
        "boxes": report.box_entry(tally, data.box_count) if boxes else None,
        **report.class_entries(tally, list(class_names(cfg))),
    }
    if distance is not None:
        summary["sa_attention_distance"] = {
            "per_head_px": distance.mean.tolist(),  # [SA layer][head], from 0
            "head_mean_by_depth_px": distance.mean.mean(1).tolist(),
            "uniform_px": explain.uniform_attention_distance(cfg.grid_size, cfg.patch_size),
        }
    if blocks is not None and images:
        gamma = explain.block_gamma_mean_abs(loaded.model).tolist()
        summary["blocks"] = report.block_entries(tally, blocks, gamma)
    if patching is not None and images:
        summary["patching"] = report.patching_entry(tally, explain.block_names(loaded.model), patching)
    return summary


def main_guarded(args: argparse.Namespace) -> int:
    """`run`, with bad input as one line on stderr (rank 0 only under torchrun) and exit code 2; Ctrl-C as a
    line saying how to continue and exit code 130."""
    try:
        run(args)
    except KeyboardInterrupt:
        if int(os.environ.get("RANK", "0")) == 0:
            print("\ninterrupted: the shards written are kept; the same command continues", file=sys.stderr)
        return 130
    except (AtlasError, DataError, DeviceError) as e:
        if int(os.environ.get("RANK", "0")) == 0:
            print(
                f"python -m cait.atlas: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                file=sys.stderr,
            )
        return 2
    return 0
