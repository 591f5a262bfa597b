"""LayerScale statistics per depth, from a model or across the epochs of a training run.

One row per block x gamma:
    {"stage": "sa" | "ca", "layer": int (0-based within the stage), "gamma": "gamma_1" | "gamma_2",
     "mean": float, "median": float, "p10": float, "p90": float}   # statistics of |gamma| over channels
gamma_1 scales the attention branch, gamma_2 the FFN branch. `layerscale_stats(model, x)` adds
"residual_ratio": mean over the batch of ||gamma * branch|| / ||residual input|| for that branch.

Across epochs: `python -m cait.train` writes these rows (without the ratio) into every line of the run's
metrics.jsonl, {"epoch": 3, "layerscale": [rows], ...}; `layerscale_stats_from_metrics` reads them back.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from ..runs import RunError, read_metrics
from ._checks import check_input, check_model

_RATIO_KIND = {("sa", "gamma_1"): "sa", ("sa", "gamma_2"): "ffn", ("ca", "gamma_1"): "ca", ("ca", "gamma_2"): "ca_ffn"}


def gamma_stats(gamma: torch.Tensor) -> dict[str, float]:
    """mean, median, 10th and 90th percentile of |gamma|."""
    g = gamma.detach().abs().flatten().double()
    q = torch.quantile(g, torch.tensor([0.5, 0.1, 0.9], dtype=g.dtype))
    return {"mean": g.mean().item(), "median": q[0].item(), "p10": q[1].item(), "p90": q[2].item()}


def layerscale_stats(model: nn.Module, x: torch.Tensor | None = None) -> list[dict[str, Any]]:
    """Rows (see module doc) for every SA and CA block of `model`, in depth order; with a batch x,
    also the measured residual-branch ratio of each branch."""
    ratios = None
    check_model(model)
    if x is not None:
        check_input(model, x)
        with torch.no_grad():
            ratios = {k: v.mean(dim=0).tolist() for k, v in model.forward_insights(x).residual_ratios.items()}
    rows = []
    for stage, gammas in _stage_gammas(model.layerscale()).items():
        for layer, per_gamma in enumerate(gammas):
            for name, gamma in per_gamma.items():
                row = {"stage": stage, "layer": layer, "gamma": name, **gamma_stats(gamma)}
                if ratios is not None:
                    row["residual_ratio"] = ratios[_RATIO_KIND[stage, name]][layer]
                rows.append(row)
    return rows


def _stage_gammas(layerscale: dict[str, torch.Tensor]) -> dict[str, list[dict[str, torch.Tensor]]]:
    # {"sa_gamma_1": [depth, d], ...} -> {"sa": [{"gamma_1": [d], "gamma_2": [d]}, ...], "ca": [...]}
    out: dict[str, list[dict[str, torch.Tensor]]] = {}
    for stage in ("sa", "ca"):
        g1, g2 = layerscale[f"{stage}_gamma_1"], layerscale[f"{stage}_gamma_2"]
        out[stage] = [{"gamma_1": a, "gamma_2": b} for a, b in zip(g1, g2)]
    return out


def layerscale_stats_from_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows (see module doc) with an "epoch" column, for every epoch of a metrics.jsonl (or of a run
    directory's) that has them, in file order."""
    rows: list[dict[str, Any]] = []
    for line in read_metrics(path):
        entry = line.get("layerscale")
        if entry is None:
            continue
        if not isinstance(entry, list) or not all(isinstance(r, dict) for r in entry):
            raise RunError(f"{path}: epoch {line['epoch']}: 'layerscale' is not a list of rows")
        for r in entry:
            missing = {"stage", "layer", "gamma"} - set(r)
            if missing:
                raise RunError(f"{path}: epoch {line['epoch']}: layerscale row lacks {sorted(missing)}: {r}")
            rows.append({"epoch": line["epoch"], **r})
    if not rows:
        raise RunError(f"{path}: no line has a 'layerscale' field (is it a training run's metrics.jsonl?)")
    return rows
