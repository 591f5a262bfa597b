"""A comparison's files from its per-image arrays (a run's merged shards, or two atlases' rows): CKA from the
HSIC sums, the head-similarity matrix and the matching, the matched heads' numbers, the answers, summary.json and
the page, written in a staging folder and renamed into OUT when all are done."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from ..atlas.report import write_csv
from ..data import ImageSet
from ..explain.causal import block_names
from ..explain.metrics import head_row
from ..provenance import SourcedModel
from . import report
from .files import FILES
from .heads import match_heads
from .page import write_page


def write_merged(
    out: Path, loaded, data, names: list[str], arrays: dict, *, options, by_position: bool = False
) -> None:
    """The run's files from the per-image arrays, written in a staging folder and renamed into OUT when all are
    done: a failure midway leaves OUT's files as they were. by_position: pair the heads by (layer, head), for
    numbers without maps (two atlases)."""
    stage = out / ".merging"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        summary, rows = _write_files(stage, loaded, data, names, arrays, options=options, by_position=by_position)
        write_page(stage / "compare.html", summary, rows, loaded, data, exemplars=options.exemplars)
        for name in (*FILES, "compare.html"):
            os.replace(stage / name, out / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    print(f"wrote compare.html, cka.csv, heads.csv, classes.csv and summary.json to {out}", file=sys.stderr)


def _side(loaded: SourcedModel, data: ImageSet, arrays: dict, key: str) -> dict:
    cfg = loaded.model.cfg
    chance = arrays.get(f"{key}_box_share")
    return {
        "model": loaded.made_from + ("" if loaded.trained else f" (RANDOM INIT: {loaded.notice})"),
        "blocks": block_names(loaded.model),
        "heads": [list(h) for h in report.heads_of(cfg)],
        "img_size": cfg.img_size,
        "grid": cfg.grid_size,
        "chance": None if chance is None or np.isnan(chance).all() else float(np.nanmean(chance)),
    }


def _write_files(
    stage: Path, loaded, data, names, arrays, *, options, by_position: bool
) -> tuple[dict, dict[str, list[dict]]]:
    """cka.csv, head_similarity.csv, heads.csv, classes.csv, disagreements.csv and summary.json into `stage`;
    returns the summary and the rows of heads, classes and disagreements (for the page)."""
    a, b = (_side(side, d, arrays, k) for side, d, k in zip(loaded, data, "ab"))
    sums = report.cka_sums(arrays, len(a["blocks"]), len(b["blocks"]))
    cka = sums.cka()
    write_csv(stage / "cka.csv", report.matrix_rows(cka, a["blocks"], b["blocks"], "block_a"))
    similarity = report.head_matrix(arrays, len(a["heads"]), len(b["heads"]))
    labels_a = [head_row(l - 1, h - 1) for l, h in a["heads"]]
    labels_b = [head_row(l - 1, h - 1) for l, h in b["heads"]]
    write_csv(stage / "head_similarity.csv", report.matrix_rows(similarity, labels_a, labels_b, "head_a"))
    matching = by_layer_and_head(a["heads"], b["heads"]) if by_position else match_heads(similarity)
    numbers = [report.side_heads(arrays, k, side["grid"]) for k, side in zip("ab", (a, b))]
    heads = report.matched_rows(matching, a["heads"], b["heads"], *numbers)
    write_csv(stage / "heads.csv", heads)
    said = report.answers(arrays, names, data[0].paths)
    rows = {"heads": heads, "classes": said.pop("classes"), "disagreements": said.pop("disagreements")}
    for name in ("classes", "disagreements"):
        write_csv(stage / f"{name}.csv", rows[name])
    summary = {
        "data": data[0].name,
        "images": int(len(arrays["index"])),
        "skipped": [data[0].paths[int(i)] for i in arrays.get("skipped", [])],
        "a": a,
        "b": b,
        "cka": {"minibatches": sums.batches, "batch_size": options.batch_size, "matrix": _listed(cka)},
        "head_similarity": _listed(similarity),
        "matching": [
            {
                "head_a": a["heads"][i],
                "head_b": b["heads"][j],
                "similarity": None if np.isnan(s) else s,
                "numbers": heads[k],
            }
            for k, (i, j, s) in enumerate(matching)
        ],
        **said,
    }
    (stage / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary, rows


def by_layer_and_head(heads_a: list, heads_b: list) -> list[tuple[int, int, float]]:
    """The heads both models have at the same (layer, head), paired (similarity unknown: NaN)."""
    return [(i, heads_b.index(h), float("nan")) for i, h in enumerate(heads_a) if h in heads_b]


def _listed(matrix: np.ndarray) -> list[list[float | None]]:
    """A matrix as JSON lists, NaN as null (strict JSON has no NaN)."""
    return [[None if np.isnan(v) else float(v) for v in row] for row in matrix]
