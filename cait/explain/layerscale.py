"""LayerScale statistics per depth, from a model or across the epochs of a training run.

One row per block x gamma:
    {"stage": "sa" | "ca", "layer": int (0-based within the stage), "gamma": "gamma_1" | "gamma_2",
     "mean": float, "median": float, "p10": float, "p90": float}   # statistics of |gamma| over channels
gamma_1 scales the attention branch, gamma_2 the FFN branch. `layerscale_stats(model, x)` adds
"residual_ratio": mean over the batch of ||gamma * branch|| / ||residual input|| for that branch.

metrics.jsonl (written by training, one JSON object per line). Lines with a "layerscale" field are read,
the epoch from their "epoch" field (else the line's position among them). Accepted forms:
    {"epoch": 3, "layerscale": [{"stage": "sa", "layer": 0, "gamma": "gamma_1", "mean": ..., "median": ...,
                                 "p10": ..., "p90": ...}, ...]}                # the rows above (preferred)
    {"epoch": 3, "layerscale": {"sa.0.gamma_1": {"mean": ..., "median": ..., "p10": ..., "p90": ...}, ...}}
    {"epoch": 3, "layerscale": {"blocks.0.gamma_1": [g_0, ..., g_d-1], ...}}  # raw gammas: stats computed
Keys may be "sa.<i>.gamma_k" / "ca.<i>.gamma_k" or state-dict names "blocks.<i>..." /
"blocks_token_only.<i>...". Other lines (e.g. per-step loss) are skipped.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

STAT_NAMES = ("mean", "median", "p10", "p90")
_KEY = re.compile(r"^(sa|ca|blocks|blocks_token_only)\.(\d+)\.(gamma_[12])$")
_STAGE = {"sa": "sa", "blocks": "sa", "ca": "ca", "blocks_token_only": "ca"}
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
    if x is not None:
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


def _row_from_key(key: str, value: Any, where: str) -> dict[str, Any]:
    match = _KEY.match(key)
    if not match:
        raise ValueError(f"{where}: layerscale key {key!r} is not like 'sa.0.gamma_1' or 'blocks.0.gamma_1'")
    stage, layer, gamma = match.groups()
    if isinstance(value, dict):
        stats = {k: float(value[k]) for k in STAT_NAMES if k in value}
    elif isinstance(value, list):
        stats = gamma_stats(torch.tensor(value, dtype=torch.float64))
    else:
        raise ValueError(f"{where}: layerscale[{key!r}] must be a dict of statistics or a list of gammas")
    return {"stage": _STAGE[stage], "layer": int(layer), "gamma": gamma, **stats}


def _rows_from_line(entry: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(entry, dict):
        return [_row_from_key(k, v, where) for k, v in entry.items()]
    if isinstance(entry, list) and all(isinstance(r, dict) for r in entry):
        rows = []
        for r in entry:
            missing = {"stage", "layer", "gamma"} - set(r)
            if missing:
                raise ValueError(f"{where}: layerscale row lacks {sorted(missing)}: {r}")
            stage = _STAGE.get(r["stage"], r["stage"])
            rows.append({**r, "stage": stage, "layer": int(r["layer"])})
        return rows
    raise ValueError(f"{where}: 'layerscale' must be a list of rows or a dict keyed 'sa.0.gamma_1'")


def layerscale_stats_from_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows (see module doc) with an "epoch" column, for every line of metrics.jsonl that has a
    "layerscale" field, in file order. A directory is read as <dir>/metrics.jsonl."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    rows: list[dict[str, Any]] = []
    seen = 0
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):  # a run killed mid-write leaves half a line
                break
            raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict) or "layerscale" not in record:
            continue
        epoch = record.get("epoch", seen)
        rows.extend({"epoch": epoch, **row} for row in _rows_from_line(record["layerscale"], where))
        seen += 1
    if not seen:
        raise ValueError(f"{path}: no line has a 'layerscale' field (is it a training run's metrics.jsonl?)")
    return rows
