"""Evaluate a CaiT: top-1 accuracy and, on data with boxes, where its explanations point.

    python -m cait.evaluate --model cait_micro_136 --data fashion-mnist-scenes --json results.json
    python -m cait.evaluate --checkpoint runs/x/last.safetensors --img-size 136 --scene-seed 1 --methods ca1_mean
    python -m cait.evaluate --checkpoint runs/teacher/best.safetensors --img-size 128 --scene-seed 1
    python -m cait.evaluate --model cait_micro_136 --corruption all:3 --baseline sweep.json   # cait.robustness
    python -m cait.evaluate --model cait_micro_136 --pixel-noise 0.08   # or --scene-style varied
    python -m cait.evaluate --pretrained --model cait_s24_224 --data DIR [--boxes boxes.json] [--limit N]
    torchrun --nproc-per-node 2 -m cait.evaluate ...   # the images shared over processes, the same numbers

--data reads the scenes, Fashion-MNIST or a folder of your images through `cait.data.read_images`: class
folders give top-1 (ImageNet synsets or the model's class names), a flat folder has no labels (no top-1;
the localization then explains the predicted class), COCO boxes (--boxes) give the localization table.
Unreadable images are skipped, counted and named in the table and the JSON. Under torchrun every process
scores every world-th batch, the counts and sums are gathered, and the first process reports.

Without --model or --checkpoint it scores the default model (cait.config.DEFAULT_MODEL) with its shipped
weights. A variant without weights here is an error naming the ways out, unless --random-init asks for a
seeded random init (said in the table and the JSON). A timm CNN that `cait.train` wrote (a distillation
teacher) is scored too, on top-1 and per class only: it has no class attention to explain.

Localization scores every map against the garment's box with the class being the TRUE label:
the pointing game (is the map's top patch inside the box?) and the share of the map's mass inside
the box. The row "chance" is what a map with its maximum at a random place would score (the box's
share of the image). Gradient and perturbation methods are costly, so they run on the first
`--attribution-subset` images; the table says how many images each row saw.

On data with boxes, top-1 is also broken down by the garment's size (its box's longer side as a share of the
image), overall and per class: whether the errors are the garments drawn small.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import explain
from ..checkpoint import atomic_write
from ..corruptions import CORRUPTIONS
from ..data import SCENE_STYLES, ImageSet, read_from_flags
from ..distributed import gather_all, process_group
from ..errors import InputError
from ..factory import load_from_flags
from ..flags import add_data_flags, add_device_flag, add_model_flags, add_precision_flag
from ..model import CaiT
from ..outputs import writable_file, write_failure
from ..provenance import SourcedModel
from ..robustness import POINTING_ROWS, format_sweep, parse_corruptions
from ..runtime import DeviceError, inference_dtype
from .core import METHOD_CHUNK, evaluate, format_table
from .sweep import corruption_section


def build_parser() -> argparse.ArgumentParser:
    """Every flag of `python -m cait.evaluate`, in the order --help lists them: the model, the data, what is
    scored, and how the run goes."""
    p = argparse.ArgumentParser(
        prog="python -m cait.evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_flags(
        p,
        checkpoint_help="weights file (default: the model's shipped weights); a timm CNN written by cait.train "
        "(e.g. the distillation teacher) is scored on top-1 and per class",
    )
    _add_data_flags(p)
    _add_scoring_flags(p)
    _add_run_flags(p)
    return p


def _add_data_flags(p: argparse.ArgumentParser) -> None:
    """Which images, at what size, and how the scenes are drawn."""
    add_data_flags(
        p,
        default="fashion-mnist-scenes",
        help="fashion-mnist-scenes (has boxes), fashion-mnist, or a folder of images: class folders (top-1 where "
        "they name the model's classes; DIR/val/ when it holds images) or a flat folder (no labels: no top-1)",
        boxes="COCO-format boxes (JSON) of a folder's images: the localization table on the images they box",
        boxes_metavar="FILE",
        limit="only N images (--subset: the same); of a folder see --sample",
        limit_aliases=("--subset",),
        sample="which N images --limit takes from a folder: stratified (default: a seeded share of each class "
        "folder) or first (the first N in folder order)",
    )
    p.add_argument(
        "--img-size",
        type=int,
        default=None,
        help="test at this input size instead of the model's (the position embedding is resampled, "
        "DeiT's rule): a test size above the training size can score higher (FixRes)",
    )
    p.add_argument(
        "--scene-seed",
        type=int,
        default=0,
        help="fashion-mnist-scenes drawn with this seed: 0 = the test scenes every number here is "
        "reported on; another seed puts the same test garments on newly drawn canvases (a "
        "held-out set for choosing e.g. --img-size, and a check on differently drawn scenes)",
    )
    p.add_argument(
        "--scene-style",
        default="default",
        choices=SCENE_STYLES,
        help="fashion-mnist-scenes drawn in this style: default (as every number here), or varied (noise level, "
        "background brightness and contrast, garment shading and blur drawn per scene), light or mixed (cait.data)",
    )
    p.add_argument(
        "--pixel-noise",
        type=float,
        default=None,
        metavar="STD",
        help="fashion-mnist-scenes with this pixel-noise std instead (the default style's is 0.04): how much a "
        "model depends on the renderer's noise level",
    )


def _add_scoring_flags(p: argparse.ArgumentParser) -> None:
    """What is scored: the explanation methods and the corruptions (with mCE's baseline)."""
    p.add_argument(
        "--attribution-subset",
        type=int,
        default=500,
        help="images for the costly methods (captum, occlusion); default 500",
    )
    p.add_argument(
        "--methods",
        nargs="*",
        default=None,
        help=f"explanations to score; default all of {', '.join(explain.METHODS)}",
    )
    p.add_argument(
        "--corruption",
        nargs="+",
        default=None,
        metavar="NAME[:SEVERITY]",
        help="also evaluate under ImageNet-C corruptions of the model's input (cait.corruptions): a name "
        "(severities 1-5), NAME:SEVERITY, 'all' or 'all:SEVERITY'; with it --methods defaults to "
        f"ca1_mean ca2_mean (pointing per corruption). Names: {', '.join(CORRUPTIONS)}",
    )
    p.add_argument("--corruption-seed", type=int, default=0, help="seed of the corruptions' random draws")
    p.add_argument(
        "--baseline",
        default=None,
        metavar="NAME_OR_FILE",
        help="with --corruption: the model (variant name or checkpoint) or an earlier sweep's JSON that mCE is "
        "measured against (Hendrycks & Dietterich 2019; cait.robustness)",
    )


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """How the run goes (batches, workers, device, precision) and where the JSON goes."""
    p.add_argument(
        "--batch-size",
        type=int,
        default=128,
        help="images per batch of the classification pass (default 128); the explanation methods take at most "
        f"{METHOD_CHUNK} of them at a time, whatever the batch, which keeps peak memory under 3 GB on the default "
        "model with every method",
    )
    p.add_argument("--workers", type=int, default=1)
    add_device_flag(p)
    add_precision_flag(
        p,
        help="the classification pass (top-1, class attention) in bf16 autocast or fp32; auto = bf16 where it "
        "measures faster than fp32 here; gradient methods always run in fp32",
    )
    p.add_argument("--json", default=None, help="also write the results as JSON to this path")


def _checked_args(p: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, list]:
    """The parsed flags and the (corruption, severity) pairs asked for; a bad combination exits 2 in one line."""
    args = p.parse_args(argv)
    unknown = {m for m in args.methods or () if m not in explain.METHODS}
    if unknown:
        p.error(f"unknown method(s) {sorted(unknown)}; choose from {', '.join(explain.METHODS)}")
    if args.batch_size <= 0:
        p.error("--batch-size must be positive")
    if args.img_size is not None and args.img_size <= 0:
        p.error("--img-size must be positive")
    try:
        pairs = parse_corruptions(args.corruption or [])
    except InputError as e:
        p.error(str(e))
    if args.baseline and not pairs:
        p.error("--baseline needs --corruption")
    if pairs and not args.methods:
        args.methods = list(POINTING_ROWS)
    return args, pairs


def _model_and_data(args: argparse.Namespace) -> tuple[SourcedModel, ImageSet]:
    loaded = load_from_flags(args, cnn=True, **({} if args.img_size is None else {"img_size": args.img_size}))
    if args.methods and not isinstance(loaded.model, CaiT):
        raise MethodsError(
            f"{args.checkpoint} holds a CNN ({loaded.model.cfg.arch}): it has no class attention, so "
            f"--methods does not apply (it is scored on top-1 and per class)"
        )
    data = read_from_flags(
        args,
        loaded.model.cfg,
        scene_seed=args.scene_seed,
        scene_style=args.scene_style,
        pixel_noise=args.pixel_noise,
    )
    return loaded, data


class MethodsError(InputError):
    """--methods asked of a model that cannot answer them."""


def main(argv: list[str] | None = None) -> int:
    """The command; under torchrun every rank runs it on its share of the images and rank 0 reports."""
    p = build_parser()
    args, pairs = _checked_args(p, argv)
    try:
        with process_group(args.device) as (rank, world, device):
            return _run(args, pairs, rank=rank, world=world, device=device)
    except DeviceError as e:  # a --device this machine does not have
        p.error(str(e))


def _run(args: argparse.Namespace, pairs: list, *, rank: int, world: int, device) -> int:
    if pairs and world > 1:
        return _error("--corruption runs in one process (its random draws follow the batches in order)", rank)
    try:
        if args.json:  # before any work: not a full run and then a failure at the end
            writable_file(Path(args.json))
        loaded, data = _model_and_data(args)
    except InputError as e:
        return _error(str(e), rank)
    model = loaded.model
    # rank 0's choice for every rank: "auto" measures, and the ranks must run one precision
    dtype = gather_all(inference_dtype(args.precision, device, remeasure=args.remeasure_precision))[0]
    kwargs = dict(
        batch_size=args.batch_size,
        workers=args.workers,
        attribution_subset=args.attribution_subset,
        methods=tuple(args.methods) if args.methods else None,
        device=device,
        dtype=dtype,
    )
    result = evaluate(model, data, **kwargs)
    if pairs:
        try:
            result["corruption"] = corruption_section(
                model, data, result, pairs, baseline=args.baseline, seed=args.corruption_seed, **kwargs
            )
        except InputError as e:  # a baseline that cannot be used
            return _error(str(e), rank)
    result.update(
        model=loaded.name or "from checkpoint",
        weights=loaded.source,
        made_from=loaded.made_from,
        img_size=model.cfg.img_size,
        data=args.data,
        scene_seed=args.scene_seed,
        scene_style=args.scene_style,
        pixel_noise=args.pixel_noise,
        precision="bf16 autocast" if dtype is not None else "fp32",
        processes=world,
    )
    if rank == 0:
        try:
            _report(result, loaded.made_from, args.json, sweep=bool(pairs))
        except OSError as e:  # the path was writable when the run began: a full disk, a folder removed
            return _error(write_failure(e), rank)
    return 0


def _error(message: str, rank: int) -> int:
    """Bad input: one line on stderr (rank 0's, under torchrun) and exit code 2."""
    if rank == 0:
        print(f"error: {message.splitlines()[0] if message else 'failed'}", file=sys.stderr)
    return 2


def _report(result: dict, made_from: str, json_path: str | None, *, sweep: bool) -> None:
    print(f"{made_from}\n{format_table(result)}")
    if sweep:
        print(format_sweep(result["corruption"]))
    if json_path:  # atomically: a reader never sees half of it
        atomic_write(Path(json_path), lambda f: f.write(json.dumps(result, indent=1).encode()))


if __name__ == "__main__":
    sys.exit(main())
