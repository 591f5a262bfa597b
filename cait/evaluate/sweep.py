"""The corruption sweep of `cait.evaluate --corruption`: `evaluate` under each ImageNet-C corruption and
severity (`cait.corruptions`), and against a baseline the mean corruption error (`cait.robustness`, which
holds the arithmetic and the records)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils.data import Dataset

from ..corruptions import corrupt
from ..factory import load_model
from ..robustness import CorruptionError, mean_corruption_error, read_sweep, summary
from .core import evaluate


def corruption_fn(name: str, severity: int, *, seed: int = 0) -> Callable[[torch.Tensor], torch.Tensor]:
    """The batch function `evaluate(corruption=...)` takes: `name` at `severity`, draws from a generator seeded
    with `seed` once, so a run over the same images in the same batches is repeated exactly."""
    generator = torch.Generator().manual_seed(seed)
    return lambda x: corrupt(x, name, severity, generator=generator)


def sweep(
    model: nn.Module, data: Dataset, pairs: Sequence[tuple[str, int]], *, seed: int = 0, **evaluate_kwargs
) -> list[dict]:
    """`summary` of `evaluate` under each (corruption, severity) of `pairs`, with those two keys added."""
    rows = []
    for name, severity in pairs:
        result = evaluate(model, data, corruption=corruption_fn(name, severity, seed=seed), **evaluate_kwargs)
        rows.append({"corruption": name, "severity": severity, **summary(result)})
    return rows


def corruption_section(
    model: nn.Module,
    data: Dataset,
    clean: dict,
    pairs: Sequence[tuple[str, int]],
    *,
    baseline: str | None = None,
    seed: int = 0,
    **evaluate_kwargs,
) -> dict:
    """What `cait.evaluate --corruption` adds to its result: the clean `summary`, the sweep's rows, and, with a
    `baseline` (a model name, a checkpoint, or an earlier sweep's JSON), the baseline's clean and swept
    numbers on the same corrupted images and the mCE against them."""
    section = {"seed": seed, "clean": summary(clean), "rows": sweep(model, data, pairs, seed=seed, **evaluate_kwargs)}
    if baseline is None:
        return section
    if baseline.endswith(".json") and Path(baseline).is_file():
        earlier = read_sweep(baseline)
        base_clean, base_rows = earlier["clean"], earlier["rows"]
    else:
        is_file = Path(baseline).is_file()
        other = load_model(None if is_file else baseline, baseline if is_file else None, cnn=True).model
        base_clean = summary(evaluate(other, data, **evaluate_kwargs))
        base_rows = sweep(other, data, pairs, seed=seed, **evaluate_kwargs)
    if base_clean["images"] != section["clean"]["images"]:
        raise CorruptionError(
            f"baseline {baseline} was scored on {base_clean['images']} images, this model on "
            f"{section['clean']['images']}: mCE compares the same images"
        )
    section["baseline"] = {"name": baseline, "clean": base_clean, "rows": base_rows}
    section["mce"] = mean_corruption_error(section["rows"], clean["top1"], base_rows, base_clean["top1"])
    return section
