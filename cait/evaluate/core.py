"""The core of `cait.evaluate`: top-1 accuracy of a model on a dataset and, on data with boxes, where its
explanations point (the pointing game and the mass in the box of every method), with the table that says it."""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from .. import explain
from ..metrics import as_dict, per_class_top1, top1_from_counts
from ..model import CaiT
from ..preprocess import EvalImages, normalise
from ..runtime import autocast

CHEAP_METHODS = (
    "ca1_mean",
    "ca2_mean",
    "class_specific",
    "rollout_raw",
    "rollout_after_proj_l",
    "rollout_after_proj_w",
    "gradient_rollout",  # one forward and one backward: about 3 forwards (benchmarks/README.md)
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
