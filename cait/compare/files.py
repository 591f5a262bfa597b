"""A comparison run's files, written whole by the merge (`write_files`) and read back by `read_run`: what the
app opens from disk and the analysis script reads.

    cka.csv              linear CKA, one row per block of A, one column per block of B
    head_similarity.csv  mean Spearman correlation of the CA maps, one row per head of A, one column per head of B
    heads.csv            per matched head pair: the similarity and each localisation/attribution number of both
    classes.csv          per class: top-1 of both, the difference, the discordant counts, McNemar's exact p
    disagreements.csv    every image the two answer differently: path, true label, A's and B's answers
    summary.json         the models, blocks, heads, the matching, top-1s, agreement, chance levels, changed confusions
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import InputError
from .options import Head

FILES = ("cka.csv", "head_similarity.csv", "heads.csv", "classes.csv", "disagreements.csv", "summary.json")


class CompareRunError(InputError):
    """A folder that holds no finished comparison run; the message is one line."""


class Disagreement(NamedTuple):
    """An image the two models answer differently: its path (relative to the data's root), its true label
    (None for unlabelled data) and the class each model predicts, all class names."""

    path: str
    label: str | None
    pred_a: str
    pred_b: str


@dataclass
class CompareRun:
    """A finished comparison, as `read_run` reads it from its folder.

    Fields:
        folder: where the run's files are.
        model_a, model_b: what each model is (its name and where its weights came from, one line each).
        blocks_a, blocks_b: each model's block names in model order, SA blocks then CA blocks ("blocks.0", ...,
            "blocks_token_only.1"), the rows and columns of `cka`.
        cka: linear CKA [len(blocks_a), len(blocks_b)] (minibatch unbiased HSIC estimator); NaN everywhere for a
            comparison of two atlases (an atlas keeps no representations), as are `head_similarity` and the
            matching's similarities (its heads are paired by layer and head).
        heads_a, heads_b: each model's CA heads as (layer, head), numbered from 1, the rows and columns of
            `head_similarity`.
        head_similarity: mean Spearman correlation of the two heads' maps on the image's pixels
            [len(heads_a), len(heads_b)].
        matching: the one-to-one pairing of the heads (Hungarian): ((layer_a, head_a), (layer_b, head_b),
            similarity), the most alike first.
        classes: per class with images, a dict: class, images, top1_a, top1_b, difference (B - A), a_only,
            b_only (images only A / only B gets right), mcnemar_p.
        disagreements: every image the two answer differently (`Disagreement`).
        summary: summary.json as a dict (top-1s, agreement, per matched head the numbers of both with the
            paired difference and its bootstrap interval, the chance level of the localisation scores, the
            confusions that changed).
    """

    folder: Path
    model_a: str
    model_b: str
    blocks_a: list[str]
    blocks_b: list[str]
    cka: np.ndarray
    heads_a: list[Head]
    heads_b: list[Head]
    head_similarity: np.ndarray
    matching: list[tuple[Head, Head, float]]
    classes: list[dict]
    disagreements: list[Disagreement]
    summary: dict


def _matrix(path: Path) -> np.ndarray:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))[1:]
    return np.array([[float(v) if v else np.nan for v in row[1:]] for row in rows], dtype=float).reshape(len(rows), -1)


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _number(value: str):
    try:
        return int(value)
    except ValueError:
        return float(value) if value else None


def _similarity(value) -> float:
    """A matched pair's similarity; NaN where the run had no maps to compare (two atlases: heads paired by place)."""
    return float("nan") if value is None else float(value)


def read_run(folder: str | Path) -> CompareRun:
    """The comparison run in `folder` (`python -m cait.compare --out folder`, or `run_compare`).

    Args:
        folder: the run's folder.

    Returns:
        The `CompareRun`.

    Raises:
        CompareRunError: one line, when the folder lacks a finished run's files or they cannot be read.
    """
    folder = Path(folder)
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise CompareRunError(f"{folder} holds no finished comparison run (no {', '.join(missing)})")
    try:
        summary = json.loads((folder / "summary.json").read_text())
        a, b = summary["a"], summary["b"]
        matching = [(tuple(m["head_a"]), tuple(m["head_b"]), _similarity(m["similarity"])) for m in summary["matching"]]
        classes = [
            {k: v if k == "class" else _number(v) for k, v in row.items()} for row in _rows(folder / "classes.csv")
        ]
        disagreements = [
            Disagreement(r["path"], r["label"] or None, r["pred_a"], r["pred_b"])
            for r in _rows(folder / "disagreements.csv")
        ]
        return CompareRun(
            folder=folder,
            model_a=a["model"],
            model_b=b["model"],
            blocks_a=list(a["blocks"]),
            blocks_b=list(b["blocks"]),
            cka=_matrix(folder / "cka.csv"),
            heads_a=[tuple(h) for h in a["heads"]],
            heads_b=[tuple(h) for h in b["heads"]],
            head_similarity=_matrix(folder / "head_similarity.csv"),
            matching=matching,
            classes=classes,
            disagreements=disagreements,
            summary=summary,
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CompareRunError(f"{folder}'s comparison files cannot be read ({type(e).__name__}: {e})") from None
