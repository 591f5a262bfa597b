"""A trained classifier's operating point for a floor on every class's top-1 ("no class under 60%").

    logits, labels = collect_logits(model, held_out)             # scenes the weights never saw
    choice = fit_weakest_class_bias(logits, labels)              # ClassBias: which class, how much
    apply_class_bias(model, choice)                              # its head bias, in place

A model trained for average accuracy can under-predict one class of a confusable group. Adding a constant
to that class's logit (a logit adjustment, which is a change of its head bias) moves errors from it to its
neighbours: its top-1 rises, theirs falls, and the average moves little. The constant is chosen on held-out
data, as the one that makes the lowest per-class top-1 highest (the floor the target is about); a tie goes to
the higher top-1. One class and one number, so that a few thousand held-out images fix it without fitting
noise; the shipped model's numbers are in its card. Class attention, gradients and every saliency map of a
class are unchanged: a constant added to a logit has no gradient and moves no attention.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from ..data.reader import ImageSet, dataset_images
from ..metrics import lowest_class, per_class_top1, top1
from ..model import CaiT


@dataclass(frozen=True)
class ClassBias:
    index: int  # the class whose logit is raised: the weakest one before
    bias: float  # added to its logit (0.0: nothing helped)
    per_class_before: list[float]  # top-1 of each class on the data it was fitted on, before ...
    per_class_after: list[float]  # ... and after
    top1_before: float
    top1_after: float
    images: int  # how many images it was fitted on

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ClassBias":
        """From to_dict()'s keys; other keys (a report's scene seed) are ignored."""
        return cls(**{f.name: d[f.name] for f in fields(cls)})


def shifted(logits: torch.Tensor, index: int, bias: float) -> torch.Tensor:
    """`logits` with `bias` added to class `index`'s column."""
    out = logits.clone()
    out[:, index] += bias
    return out


def fit_weakest_class_bias(
    logits: torch.Tensor, labels: torch.Tensor, *, step: float = 0.05, limit: float = 2.0
) -> ClassBias:
    """The bias in [0, limit] (a grid of `step`) for the weakest class's logit that makes the lowest
    per-class top-1 highest; a tie goes to the higher top-1, then to the smaller bias."""
    num_classes = logits.shape[1]
    before = per_class_top1(logits.argmax(1), labels, num_classes)
    index, _ = lowest_class(before)
    best_key, best_bias = None, 0.0
    for k in range(int(round(limit / step)) + 1):
        bias = k * step
        moved = shifted(logits, index, bias)
        predicted = moved.argmax(1)
        key = (
            round(lowest_class(per_class_top1(predicted, labels, num_classes))[1], 6),
            round(top1(predicted, labels), 6),
        )
        if best_key is None or key > best_key:
            best_key, best_bias = key, bias
    after = shifted(logits, index, best_bias)
    return ClassBias(
        index=index,
        bias=round(best_bias, 6),
        per_class_before=before.tolist(),
        per_class_after=per_class_top1(after.argmax(1), labels, num_classes).tolist(),
        top1_before=top1(logits.argmax(1), labels),
        top1_after=top1(after.argmax(1), labels),
        images=len(labels),
    )


def apply_class_bias(model: CaiT, choice: ClassBias) -> None:
    """Raise the chosen class's logit in `model` itself: the bias of its classifier (`head`)."""
    with torch.no_grad():
        model.head.bias[choice.index] += choice.bias


@torch.no_grad()
def collect_logits(
    model: nn.Module, data: Dataset, *, batch_size: int = 128, workers: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 logits [N, classes], labels [N]) of `model` on the readable images of `data` (an ImageSet of
    `cait.data.read_images`, or a dataset of (PIL image, label)), read as `cait.evaluate` reads them."""
    if not isinstance(data, ImageSet):
        data = dataset_images(data, model.cfg, name="held-out images")
    loader = DataLoader(data, batch_size=batch_size, num_workers=workers)
    model = model.eval()
    logits, labels = [], []
    for x, y, _, _, ok in tqdm(loader, desc="logits", unit="batch"):
        logits.append(model(x[ok]).float())
        labels.append(y[ok])
    return torch.cat(logits), torch.cat(labels)
