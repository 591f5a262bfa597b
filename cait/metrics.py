"""Classification scores, as fractions in [0, 1] everywhere (evaluation, training, calibration, cards)."""

from __future__ import annotations

import math

import torch


def top1(predicted: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of images whose predicted class index is their label (0.0 for no images)."""
    return top1_from_counts(int((predicted == labels).sum()), len(labels))


def top1_from_counts(correct: int | float, images: int | float) -> float:
    """Top-1 from counts summed over batches or processes (training): correct / images, 0.0 for no images."""
    return correct / images if images else 0.0


def percent(fraction: float) -> float:
    """A fraction as a percentage, for display only: 100 * fraction rounded to 10 decimals, so that a value
    shows as the percentage it stands for (100 * 0.1095 is 10.950000000000001, which `:.1f` shows as 11.0)."""
    return round(100 * fraction, 10)


def per_class_top1(predicted: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Top-1 of each class from predicted class indices: [num_classes], NaN for a class without images."""
    hits = torch.zeros(num_classes).index_add_(0, labels, (predicted == labels).float())
    return hits / torch.bincount(labels, minlength=num_classes).float()


def lowest_class(per_class: torch.Tensor | list[float | None]) -> tuple[int, float]:
    """(index, top-1) of the weakest class; classes without images (NaN or None) are left out."""
    scores = [math.nan if v is None else float(v) for v in per_class]
    index = min((i for i, v in enumerate(scores) if not math.isnan(v)), key=scores.__getitem__)
    return index, scores[index]


def as_dict(per_class: torch.Tensor, names: list[str]) -> dict[str, float | None]:
    """Per-class top-1 by class name, None for a class without images (JSON has no NaN)."""
    return {name: None if math.isnan(v) else v for name, v in zip(names, per_class.tolist())}
