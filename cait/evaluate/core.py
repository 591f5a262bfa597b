"""The core of `cait.evaluate`: top-1 accuracy of a model on a dataset and, on data with boxes, where its
explanations point (the pointing game and the mass in the box of every method), with the table that says it."""

from __future__ import annotations

import copy
import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm import tqdm

from .. import explain
from ..data.reader import ImageSet, dataset_images
from ..distributed import gather_all, rank_indices
from ..explain.methods import ca_mean_layer, ca_mean_methods
from ..explain.metrics import box_share, head_localization
from ..metrics import as_dict, per_class_top1, top1_from_counts
from ..model import CaiT
from ..preprocess import normalise
from ..runtime import autocast

CHEAP_METHODS = (  # a model of two CA layers' (the paper's); `cheap_methods` gives any model's
    "ca1_mean",
    "ca2_mean",
    "class_specific",
    "rollout_raw",
    "rollout_after_proj_l",
    "rollout_after_proj_w",
    "gradient_rollout",  # one forward and one backward: about 3 forwards (benchmarks/README.md)
)


def cheap_methods(ca_depth: int) -> list[str]:
    """The methods of about one pass each for a model of `ca_depth` CA layers: caK_mean for each, then the others."""
    return [*ca_mean_methods(ca_depth), *(m for m in CHEAP_METHODS if ca_mean_layer(m) is None)]


# images the explanation methods see at once, whatever --batch-size: their gradients and rollouts keep every
# layer's activations or attention per image (about 50 MB each on cait_micro_136), so a batch of 128 at once
# peaked near 8 GB; in chunks of 16 the evaluation's peak memory stays under 3 GB (benchmarks/README.md)
METHOD_CHUNK = 16
# Rows name each CA head from 1, as the app and the figures do: "ca1_head1" is CA layer 1's first head.
# edges of the garment-size bins (the box's longer side as a share of the image) that top-1 is broken down by:
# whether errors come from garments drawn small
BOX_SIDE_BINS = (0.0, 0.3, 0.4, 0.5, 0.6, 1.0)


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
    """Running sums of pointing-game hits and mass-in-box shares per explanation row (sums, not means, so
    that the tallies of torchrun's ranks add up to a one-process run's)."""

    def __init__(self) -> None:
        self.hits: dict[str, float] = defaultdict(float)
        self.mass: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)

    def add(self, name: str, heat: torch.Tensor, boxes: torch.Tensor, img_size: int) -> None:
        self.add_scores(name, explain.pointing_game(heat, boxes, img_size), explain.mass_in_box(heat, boxes, img_size))

    def add_scores(self, name: str, hits: torch.Tensor, mass: torch.Tensor) -> None:
        self.hits[name] += hits.float().sum().item()
        self.mass[name] += mass.sum().item()
        self.count[name] += len(hits)

    def merge(self, other: _Tally) -> None:
        for name in other.count:
            self.hits[name] += other.hits[name]
            self.mass[name] += other.mass[name]
            self.count[name] += other.count[name]

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


def _localize(tally: _Tally, model: CaiT, x, y, boxes, maps, groups, *, shared: torch.Tensor | None) -> None:
    """Add one batch of images with boxes to the localization tally: chance (the box's share of the image),
    every CA head (`explain.metrics.head_localization`, as `cait.atlas`) and their mean, and each group of methods on
    its first `todo` images. Work shared between methods is done once (saliency_maps); the CA head means
    reuse the classification pass's maps (`shared`) when that pass ran in fp32, as the methods do."""
    img_size = model.cfg.img_size
    chance = box_share(boxes, img_size)
    tally.add_scores("chance", chance, chance)
    pointing, mass = head_localization(maps, boxes, img_size)
    for layer, h in itertools.product(range(pointing.shape[1]), range(pointing.shape[2])):
        tally.add_scores(explain.metrics.head_row(layer, h), pointing[:, layer, h], mass[:, layer, h])
    tally.add("ca_mean_both_layers", maps.mean(dim=(1, 2)), boxes, img_size)
    for group, todo in groups:
        for start in range(0, todo if group else 0, METHOD_CHUNK):  # the methods' memory grows with the images
            part = slice(start, min(start + METHOD_CHUNK, todo))
            maps = None if shared is None else shared[part]
            for name, heat in explain.saliency_maps(model, x[part], y[part], group, class_attention_maps=maps):
                tally.add(name, heat.cpu(), boxes[part], img_size)


@dataclass
class _Counts:
    """What one process adds up over its images; `merge`d over torchrun's ranks into the result."""

    confusion: torch.Tensor  # [true, predicted], labelled images
    tally: _Tally = field(default_factory=_Tally)
    images: int = 0  # readable images scored
    skipped: list[int] = field(default_factory=list)  # indices of unreadable images
    by_side: list[torch.Tensor] = field(default_factory=list)  # per batch [n, 3]: box side, correct, label

    def merge(self, other: _Counts) -> None:
        self.confusion += other.confusion
        self.tally.merge(other.tally)
        self.images += other.images
        self.skipped += other.skipped
        self.by_side += other.by_side


def as_image_set(data: Dataset, cfg) -> ImageSet:
    """`data` as the reader's ImageSet in pixels (normalised here, after a corruption): an ImageSet, or a
    dataset of (PIL image, label) items such as `cait.data.build_dataset`'s (its boxes, if any, kept)."""
    if not isinstance(data, ImageSet):
        data = dataset_images(data, cfg, name=type(data).__name__)
    data = copy.copy(data)
    data.normalise = False
    return data


def _score_batches(model, loader, counts: _Counts, todo: dict, *, device, dtype, corruption) -> None:
    """Add every batch of `loader` (reader items) to `counts`; todo: the methods to localize, the costly ones
    on images of index below todo["subset"]."""
    cfg, explained = model.cfg, isinstance(model, CaiT)
    classes = counts.confusion.shape[0]
    quiet = dist.is_initialized() and dist.get_rank() > 0
    for x, y, boxes, index, ok in tqdm(loader, desc="evaluate", unit="batch", disable=quiet):
        counts.skipped += index[~ok].tolist()
        x, y, boxes, index = x[ok].to(device), y[ok], boxes[ok], index[ok]
        if not len(x):
            continue
        x = normalise(x if corruption is None else corruption(x), cfg)
        with autocast(dtype, device):
            ca = explain.class_attention(model, x) if explained else None
            logits = ca.logits if explained else model(x)
        predicted = logits.argmax(-1).cpu()
        counts.images += len(y)
        known = y >= 0
        cells = torch.bincount(y[known] * classes + predicted[known], minlength=classes * classes)
        counts.confusion += cells.view(classes, classes)
        boxed = ~boxes.isnan().any(-1)
        _add_sides(counts, boxes[boxed & known], predicted[boxed & known], y[boxed & known], cfg.img_size)
        if boxed.any() and explained:
            on = boxed.to(device)
            target = torch.where(known, y, predicted)[boxed].to(device)  # unlabelled: the predicted class
            costly = int((index[boxed] < todo["subset"]).sum())  # indices ascend: a prefix of the batch
            groups = ((todo["cheap"], int(boxed.sum())), (todo["costly"], costly))
            maps = ca.maps[on]
            shared = maps if dtype is None else None
            _localize(counts.tally, model, x[on], target, boxes[boxed], maps.cpu(), groups, shared=shared)


def _add_sides(counts: _Counts, boxes: torch.Tensor, predicted: torch.Tensor, truth: torch.Tensor, img: int) -> None:
    """Keep (box's longer side / image, correct, label) of labelled images with a box, for `accuracy_by_box_side`."""
    if len(boxes):
        side = torch.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]) / img
        counts.by_side.append(torch.stack([side, (predicted == truth).float(), truth.float()], 1))


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
    """Top-1 on the labelled images of `data` (an `ImageSet` of `cait.data.read_images`, or a dataset of
    (PIL image, label)) and, on images with a box when `model` is a CaiT, the localization of every
    explanation method, with the true class as target (the predicted one for an unlabelled image). A timm
    CNN: accuracy only. Unreadable images are skipped and named. dtype: autocast dtype of the classification
    pass, whose class attention is scored too (None: fp32); the other methods (gradients, rollout, occlusion)
    always run in fp32. corruption: applied to each batch of model views in [0, 1] before normalisation
    (`cait.robustness`); boxes stay where they were. Under torchrun each rank scores its share of the batches
    (`cait.distributed.rank_indices`) and every rank returns the sums of all."""
    model = model.to(device).eval()
    data = as_image_set(data, model.cfg)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = rank_indices(len(data), batch_size, rank, world)
    loader = DataLoader(Subset(data, mine), batch_size=batch_size, num_workers=workers)
    ca_depth = model.cfg.depth_token_only if isinstance(model, CaiT) else 0
    every = explain.METHODS.names(ca_depth) if isinstance(model, CaiT) else explain.METHODS
    asked = [explain.METHODS.canonical(m) for m in (every if methods is None else methods)]
    todo = {
        "cheap": [m for m in asked if m in cheap_methods(ca_depth)],
        "costly": [m for m in asked if m not in cheap_methods(ca_depth)],
        "subset": attribution_subset,
    }
    classes = model.cfg.num_classes
    counts = _Counts(torch.zeros(classes, classes, dtype=torch.long))
    _score_batches(model, loader, counts, todo, device=device, dtype=dtype, corruption=corruption)
    parts = gather_all(counts)
    total = parts[0]
    for part in parts[1:]:
        total.merge(part)
    return _result(total, data)


def _result(counts: _Counts, data: ImageSet) -> dict:
    names = [str(c) for c in data.classes]
    confusion = counts.confusion
    labelled = int(confusion.sum())
    per_class = as_dict(confusion.diag() / confusion.sum(1), names)
    by_side = []
    if counts.by_side:
        side, correct, label = torch.cat(counts.by_side).T.contiguous()
        by_side = accuracy_by_box_side(side, correct > 0, label.long(), names)
    return {
        "dataset": data.name,
        "images": counts.images,
        "labelled": labelled,
        "top1": top1_from_counts(confusion.diag().sum().item(), labelled) if labelled else None,
        "per_class_top1": per_class if labelled else {},
        "top1_by_box_side": by_side,
        "confusion": confusion.tolist(),
        "localization": counts.tally.rows(),
        "skipped": [data.paths[i] for i in sorted(counts.skipped)],
    }


def format_table(result: dict) -> str:
    images = result["images"]
    if result.get("top1") is None:
        lines = [f"top-1 accuracy: - on {images} images (no labels that name the model's classes)"]
    else:
        labelled = result.get("labelled", images)
        of = "" if labelled == images else f" ({labelled} of them labelled)"
        lines = [f"top-1 accuracy: {100 * result['top1']:.2f}% on {labelled} images{of}"]
    if result.get("dataset"):
        lines.append(f"data: {result['dataset']}")
    skipped = result.get("skipped") or []
    if skipped:
        shown = ", ".join(skipped[:5]) + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else "")
        lines.append(f"skipped {len(skipped)} unreadable image(s): {shown}")
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
