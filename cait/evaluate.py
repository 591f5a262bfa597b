"""Evaluate a CaiT: top-1 accuracy and, on data with boxes, where its explanations point.

    python -m cait.evaluate --model cait_micro_136 --data fashion-mnist-scenes --json results.json
    python -m cait.evaluate --checkpoint runs/x/last.safetensors --img-size 136 --scene-seed 1 --methods ca1_mean
    python -m cait.evaluate --checkpoint runs/teacher/best.safetensors --img-size 128 --scene-seed 1
    python -m cait.evaluate --model cait_micro_136 --corruption all:3 --baseline sweep.json   # cait.robustness
    python -m cait.evaluate --model cait_micro_136 --pixel-noise 0.08   # or --scene-style varied

A timm CNN that `cait.train` wrote (a distillation teacher) is scored too, on top-1 and per class only: it
has no class attention to explain.

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
import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from . import explain
from .checkpoint import CheckpointError, stored_config
from .config import CNNConfig
from .corruptions import CORRUPTIONS
from .data import SCENE_STYLES, DataError, build_dataset
from .factory import create_model
from .flags import add_device_flag, add_model_flags, add_precision_flag
from .metrics import as_dict, per_class_top1, top1_from_counts
from .model import CaiT
from .preprocess import EvalImages, normalise
from .runtime import DeviceError, autocast, inference_dtype, resolve_device
from .train.teacher import load_teacher

CHEAP_METHODS = (
    "ca1_mean",
    "ca2_mean",
    "class_specific",
    "rollout_raw",
    "rollout_after_proj_l",
    "rollout_after_proj_w",
)
# Rows name each CA head from 1, as the app and the figures do: "ca1_head1" is CA layer 1's first head.
# edges of the garment-size bins (the box's longer side as a share of the image) that top-1 is broken down by:
# whether errors come from garments drawn small
BOX_SIDE_BINS = (0.0, 0.3, 0.4, 0.5, 0.6, 1.0)


def head_row(layer: int, head: int) -> str:
    """The row name of CA layer `layer`'s head `head` (both 0-based indices): ca<layer+1>_head<head+1>."""
    return f"ca{layer + 1}_head{head + 1}"


def accuracy_by_box_side(
    sides: torch.Tensor, correct: torch.Tensor, labels: torch.Tensor, names: list[str]
) -> list[dict]:
    """Top-1 overall and per class within each BOX_SIDE_BINS bin of `sides` (the box's longer side / image side,
    per image), from per-image `correct` (bool) and `labels`; bins without images are left out."""
    edges = torch.tensor(BOX_SIDE_BINS[1:-1], dtype=sides.dtype)
    which = torch.bucketize(sides, edges, right=True)  # bin i holds BOX_SIDE_BINS[i] <= side < BOX_SIDE_BINS[i + 1]
    rows = []
    for i, (lo, hi) in enumerate(zip(BOX_SIDE_BINS, BOX_SIDE_BINS[1:])):
        inside = which == i
        if inside.any():
            predicted = torch.where(correct[inside], labels[inside], -1)  # -1: some wrong class
            per_class = as_dict(per_class_top1(predicted, labels[inside], len(names)), names)
            per_class = {name: v for name, v in per_class.items() if v is not None}
            rows.append(
                {
                    "box_side": [lo, hi],
                    "images": int(inside.sum()),
                    "top1": correct[inside].float().mean().item(),
                    "per_class_top1": per_class,
                }
            )
    return rows


class _Tally:
    """Running sums of pointing-game hits and mass-in-box shares per explanation row."""

    def __init__(self) -> None:
        self.hits: dict[str, float] = defaultdict(float)
        self.mass: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)

    def add(self, name: str, heat: torch.Tensor, boxes: torch.Tensor, img_size: int) -> None:
        self.hits[name] += explain.pointing_game(heat, boxes, img_size).float().sum().item()
        self.mass[name] += explain.mass_in_box(heat, boxes, img_size).sum().item()
        self.count[name] += len(boxes)

    def rows(self) -> list[dict]:
        return [
            {
                "method": k,
                "pointing_game": self.hits[k] / self.count[k],
                "mass_in_box": self.mass[k] / self.count[k],
                "images": self.count[k],
            }
            for k in self.count
        ]


def _localize(tally: _Tally, model: CaiT, x, y, boxes, box_area, ca, groups, *, shared: torch.Tensor | None) -> None:
    """Add one batch to the localization tally: chance (`box_area`, the box's share of the image), every CA head
    and their mean, and each group of methods on its first `todo` images. Work shared between methods is done
    once (saliency_maps); the CA head means reuse the classification pass's maps (`shared`) when that pass ran
    in fp32, as the methods do."""
    img_size = model.cfg.img_size
    tally.hits["chance"] += box_area.sum().item()
    tally.mass["chance"] += box_area.sum().item()
    tally.count["chance"] += len(y)
    for layer, h in itertools.product(range(ca.maps.shape[1]), range(ca.maps.shape[2])):
        tally.add(head_row(layer, h), ca.maps[:, layer, h], boxes, img_size)
    tally.add("ca_mean_both_layers", ca.mean.mean(dim=1), boxes, img_size)
    for group, todo in groups:
        if group and todo > 0:
            maps = None if shared is None else shared[:todo]
            for name, heat in explain.saliency_maps(model, x[:todo], y[:todo], group, class_attention_maps=maps):
                tally.add(name, heat.cpu(), boxes[:todo], img_size)


def evaluate(
    model: nn.Module,
    data: Dataset,
    *,
    batch_size: int = 128,
    workers: int = 1,
    attribution_subset: int = 500,
    methods: tuple[str, ...] | None = None,
    device: torch.device = torch.device("cpu"),
    dtype: torch.dtype | None = None,
    corruption: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict:
    """Accuracy on `data` and, when it carries boxes and `model` is a CaiT, the localization of every explanation
    method (a timm CNN: accuracy only). dtype: autocast dtype of the classification pass, whose class attention
    is scored too (None: fp32);
    the other methods (gradients, rollout, occlusion) always run in fp32. corruption: applied to each batch of
    model views in [0, 1] before normalisation (`cait.robustness`); boxes stay where they were."""
    model = model.to(device).eval()
    ds = EvalImages(data, model, normalise=corruption is None)
    loader = DataLoader(ds, batch_size=batch_size, num_workers=workers)
    asked = [explain.METHODS.canonical(m) for m in (explain.METHODS if methods is None else methods)]
    cheap, costly = [m for m in asked if m in CHEAP_METHODS], [m for m in asked if m not in CHEAP_METHODS]
    img_size, explained = model.cfg.img_size, isinstance(model, CaiT)
    seen, classes = 0, model.cfg.num_classes
    confusion = torch.zeros(classes, classes, dtype=torch.long)  # [true, predicted]
    tally, sides, correct, labels = _Tally(), [], [], []
    for x, y, boxes in tqdm(loader, desc="evaluate", unit="batch"):
        x, y = x.to(device), y.to(device)
        if corruption is not None:
            x = normalise(corruption(x), model.cfg)
        with autocast(dtype, device):
            ca = explain.class_attention(model, x) if explained else None
            logits = ca.logits if explained else model(x)
        truth, predicted = y.cpu(), logits.argmax(-1).cpu()
        confusion += torch.bincount(truth * classes + predicted, minlength=classes * classes).view(classes, classes)
        if ds.boxes is not None:
            width, height = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
            sides.append(torch.maximum(width, height) / img_size)
            correct.append(predicted == truth)
            labels.append(truth)
        if ds.boxes is not None and explained:
            todo = {"cheap": (cheap, len(y)), "costly": (costly, min(len(y), attribution_subset - seen))}
            box_area = width * height / img_size**2
            _localize(tally, model, x, y, boxes, box_area, ca, todo.values(), shared=ca.maps if dtype is None else None)
        seen += len(y)
    names = [str(c) for c in getattr(data, "classes", range(classes))]
    per_class = as_dict(confusion.diag() / confusion.sum(1), names)
    by_side = accuracy_by_box_side(torch.cat(sides), torch.cat(correct), torch.cat(labels), names) if sides else []
    return {
        "images": seen,
        "top1": top1_from_counts(confusion.diag().sum().item(), seen),
        "per_class_top1": per_class,
        "top1_by_box_side": by_side,
        "confusion": confusion.tolist(),
        "localization": tally.rows(),
    }


def format_table(result: dict) -> str:
    lines = [f"top-1 accuracy: {100 * result['top1']:.2f}% on {result['images']} images"]
    if result.get("per_class_top1"):
        lines.append(
            "per class: "
            + ", ".join(
                f"{name} {'-' if v is None else f'{100 * v:.0f}%'}" for name, v in result["per_class_top1"].items()
            )
        )
    if result.get("top1_by_box_side"):
        lines.append(
            "top-1 by the garment box's side (share of the image): "
            + ", ".join(
                f"{row['box_side'][0]:.1f}-{row['box_side'][1]:.1f} {100 * row['top1']:.0f}% ({row['images']})"
                for row in result["top1_by_box_side"]
            )
        )
    rows = result.get("localization") or []
    if rows:
        lines.append(f"{'method':<26}{'pointing game':>15}{'mass in box':>13}{'images':>8}")
        for row in sorted(rows, key=lambda r: -r["pointing_game"]):
            lines.append(
                f"{row['method']:<26}{100 * row['pointing_game']:>14.1f}%"
                f"{100 * row['mass_in_box']:>12.1f}%{row['images']:>8}"
            )
    return "\n".join(lines)


def load_model(name: str | None, checkpoint: str | None, *, img_size: int | None = None) -> nn.Module:
    """The model to score: a CaiT by `name` (its shipped weights unless `checkpoint`) or from `checkpoint`,
    or the timm CNN a `cait.train --model timm:...` checkpoint holds; `img_size` overrides its input size."""
    if name is None and checkpoint is not None and isinstance(stored_config(checkpoint), CNNConfig):
        return load_teacher(checkpoint, img_size=img_size)
    size = {} if img_size is None else {"img_size": img_size}
    return create_model(name, checkpoint, pretrained=checkpoint is None, **size)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cait.evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_flags(
        p,
        checkpoint_help="weights file (default: the model's shipped weights); a timm CNN written by cait.train "
        "(e.g. the distillation teacher) is scored on top-1 and per class",
        pretrained_help=None,
    )
    p.add_argument(
        "--data",
        default="fashion-mnist-scenes",
        help="fashion-mnist-scenes (has boxes), fashion-mnist, or an ImageFolder root (its val/ split)",
    )
    p.add_argument(
        "--img-size",
        type=int,
        default=None,
        help="test at this input size instead of the model's (the position embedding is resampled, "
        "DeiT's rule): a test size above the training size can score higher (FixRes)",
    )
    p.add_argument("--subset", type=int, default=None, help="evaluate only the first N images")
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
        "background brightness and contrast, garment shading and blur drawn per scene; cait.data)",
    )
    p.add_argument(
        "--pixel-noise",
        type=float,
        default=None,
        metavar="STD",
        help="fashion-mnist-scenes with this pixel-noise std instead (the default style's is 0.04): how much a "
        "model depends on the renderer's noise level",
    )
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
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=1)
    add_device_flag(p)
    add_precision_flag(
        p,
        help="the classification pass (top-1, class attention) in bf16 autocast or fp32; auto = bf16 where it "
        "measures faster than fp32 here; gradient methods always run in fp32",
    )
    p.add_argument("--json", default=None, help="also write the results as JSON to this path")
    return p


def _checked_args(p: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, list]:
    """The parsed flags and the (corruption, severity) pairs asked for; a bad combination exits 2 in one line."""
    from .robustness import POINTING_ROWS, parse_corruptions

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
    except ValueError as e:
        p.error(str(e))
    if args.baseline and not pairs:
        p.error("--baseline needs --corruption")
    if pairs and not args.methods:
        args.methods = list(POINTING_ROWS)
    return args, pairs


def _model_and_data(args: argparse.Namespace) -> tuple[nn.Module, Dataset]:
    model = load_model(args.model, args.checkpoint, img_size=args.img_size)
    if args.methods and not isinstance(model, CaiT):
        raise ValueError(
            f"{args.checkpoint} holds a CNN ({model.cfg.arch}): it has no class attention, so "
            f"--methods does not apply (it is scored on top-1 and per class)"
        )
    data = build_dataset(  # scenes: read from the disk cache
        args.data,
        "val",
        seed=args.scene_seed,
        subset=args.subset,
        cache=True,
        style=args.scene_style,
        pixel_noise=args.pixel_noise,
    )
    return model, data


def main(argv: list[str] | None = None) -> int:
    # cait.robustness builds on evaluate() above, so the command line imports it here, not at the top
    from .robustness import corruption_section, format_sweep

    p = build_parser()
    args, pairs = _checked_args(p, argv)
    try:
        device = resolve_device(args.device)
    except DeviceError as e:
        p.error(str(e))
    try:
        model, data = _model_and_data(args)
    except (CheckpointError, DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dtype = inference_dtype(args.precision, device, remeasure=args.remeasure_precision)
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
        except (CheckpointError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    result.update(
        model=args.model or "from checkpoint",
        checkpoint=model.source,
        img_size=model.cfg.img_size,
        data=args.data,
        scene_seed=args.scene_seed,
        scene_style=args.scene_style,
        pixel_noise=args.pixel_noise,
        precision="bf16 autocast" if dtype is not None else "fp32",
    )
    print(format_table(result))
    if pairs:
        print(format_sweep(result["corruption"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
