"""A comparison's merged numbers: the shards' per-image arrays and HSIC rows read in image order, and from them
the files' rows (CKA, head similarity, matched heads, classes, disagreements) and summary.json."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..atlas.shards import Cover, read_shard
from ..explain.metrics import head_row
from .cka import HSICSums
from .heads import head_labels
from .stats import class_rows, confusion_changes, mcnemar_exact, paired_difference

HSIC = ("hsic_cross", "hsic_a", "hsic_b")
# per matched head pair: the atlas's numbers of both; entropy as a share of the uniform map's (ln N), so that
# heads on grids of different sizes compare
HEAD_NUMBERS = ("entropy_share", "dla", "pointing", "mass_in_box")


def merged(shards: list[Path], cover: Cover) -> dict[str, np.ndarray]:
    """Every array of the shards, concatenated in image order (the HSIC rows minibatch by minibatch)."""
    parts = [read_shard(p, cover) for p in shards]
    keys = {k for p in parts for k in p}
    return {k: np.concatenate([p[k] for p in parts if k in p]) for k in keys}


def cka_sums(arrays: dict[str, np.ndarray], blocks_a: int, blocks_b: int) -> HSICSums:
    """The HSIC sums of every minibatch, summed in image order (the same sum however the shards fell)."""
    if "hsic_cross" not in arrays:
        return HSICSums.zeros(blocks_a, blocks_b)
    cross, a, b = (arrays[k] for k in HSIC)
    return HSICSums(cross.sum(0), a.sum(0), b.sum(0), len(cross))


def entropy_share(entropy: np.ndarray, grid: int) -> np.ndarray:
    """Map entropy in nats over ln(grid * grid), the uniform map's: 0 all on one patch, 1 uniform."""
    return entropy / math.log(grid * grid)


def side_heads(arrays: dict[str, np.ndarray], side: str, grid: int) -> dict[str, np.ndarray]:
    """One side's per-image head numbers [n, L * H] by `HEAD_NUMBERS` (NaN columns where there are no boxes)."""
    n = len(arrays["index"])
    numbers = {}
    for name in HEAD_NUMBERS:
        key = f"{side}_{'entropy' if name == 'entropy_share' else name}"
        value = arrays.get(key)
        value = np.full((n, 1), np.nan) if value is None else value.reshape(n, -1)
        numbers[name] = entropy_share(value, grid) if name == "entropy_share" else value
    return numbers


def matched_rows(matching: list, heads_a: list, heads_b: list, numbers_a: dict, numbers_b: dict) -> list[dict]:
    """Per matched pair (rows of heads.csv): the two heads, their similarity, and per number the mean of each,
    B - A and its bootstrap 95% interval over the images."""
    rows = []
    for i, j, similarity in matching:
        row: dict[str, Any] = {"head_a": head_row(*_index(heads_a[i])), "head_b": head_row(*_index(heads_b[j]))}
        row["similarity"] = similarity
        for name in HEAD_NUMBERS:
            d = paired_difference(_column(numbers_a[name], i), _column(numbers_b[name], j))
            low, high = d["ci95"] or (None, None)
            row |= {f"{name}_a": d["a"], f"{name}_b": d["b"], f"{name}_difference": d["difference"]}
            row |= {f"{name}_ci_low": low, f"{name}_ci_high": high}
        rows.append(row)
    return rows


def _column(values: np.ndarray, k: int) -> np.ndarray:
    """Head k's column of [n, heads] numbers (the one NaN column of a number the data cannot give)."""
    return values[:, k] if values.shape[1] > 1 else values[:, 0]


def _index(head: tuple[int, int]) -> tuple[int, int]:
    return head[0] - 1, head[1] - 1


def matrix_rows(matrix: np.ndarray, rows: list[str], columns: list[str], corner: str) -> list[dict]:
    """A matrix as CSV rows: the row's name under `corner`, then one column per name of `columns`."""
    return [{corner: name, **{c: float(v) for c, v in zip(columns, values)}} for name, values in zip(rows, matrix)]


def answers(arrays: dict[str, np.ndarray], names: list[str], paths: list[str]) -> dict[str, Any]:
    """Top-1 of each (over labelled images), agreement (over every image), McNemar's exact test overall, the
    per-class rows, the changed confusions and every disagreement (path, label, A's and B's answers)."""
    label, pred_a, pred_b = (arrays[k].astype(int) for k in ("label", "a_prediction", "b_prediction"))
    known = label >= 0
    right_a, right_b = pred_a[known] == label[known], pred_b[known] == label[known]
    a_only, b_only = int((right_a & ~right_b).sum()), int((right_b & ~right_a).sum())
    differ = np.flatnonzero(pred_a != pred_b)
    return {
        "labelled": int(known.sum()),
        "top1_a": float(right_a.mean()) if known.any() else None,
        "top1_b": float(right_b.mean()) if known.any() else None,
        "agreement": float((pred_a == pred_b).mean()),
        "mcnemar": {"a_only": a_only, "b_only": b_only, "p": mcnemar_exact(a_only, b_only)},
        "classes": class_rows(label[known], pred_a[known], pred_b[known], names),
        "confusions_changed": confusion_changes(label[known], pred_a[known], pred_b[known], names),
        "disagreements": [
            {
                "path": paths[int(arrays["index"][i])],
                "label": names[label[i]] if label[i] >= 0 else "",
                "pred_a": names[pred_a[i]],
                "pred_b": names[pred_b[i]],
            }
            for i in differ
        ],
    }


def heads_of(cfg) -> list[tuple[int, int]]:
    return head_labels(cfg.depth_token_only, cfg.num_heads)


def head_matrix(arrays: dict[str, np.ndarray], heads_a: int, heads_b: int) -> np.ndarray:
    """Mean over images of the per-image head similarity [Ha, Hb] (an image where a map is flat left out)."""
    sim = arrays.get("head_similarity")
    if sim is None or not len(sim):
        return np.full((heads_a, heads_b), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a pair flat on every image: NaN, said as such
        return np.nanmean(sim.astype(np.float64), axis=0)
