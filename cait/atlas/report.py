"""The atlas's files from its shards: images.csv (one row per image), heads.csv (per CA head over the data),
summary.json, and parquet copies when pyarrow is installed. Shards are read one at a time in image order, so
memory holds running sums and the bounded top-k exemplar lists, never the whole data."""

from __future__ import annotations

import csv
import heapq
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..data.coco import LEFT_OUT, BoxCount
from ..explain.metrics import head_row
from .compute import HEAD_NUMBERS, TOKEN_REGION, TOKEN_TOP, head_numbers
from .shards import read_shard

Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval of the mean
BINS = 30  # histogram bins of each head's distributions on the page
BEST_IN_BOX = "patch_tokens_best_in_box"  # the shards' share of the best token-patching region inside the box


def block_label(name: str) -> str:
    """'blocks.3' -> 'sa4', 'blocks_token_only.0' -> 'ca1' (numbered from 1, as the heads)."""
    stage, k = name.rsplit(".", 1)
    return f"{'ca' if stage == 'blocks_token_only' else 'sa'}{int(k) + 1}"


def _added(total: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`total` plus every row of `values` (along the first axis), one row at a time in order: float64 sums
    that do not depend on where the rows were cut into shards (a sum per shard, then over the shards, would
    round differently for one process and torchrun's ranks)."""
    return np.add.accumulate(np.concatenate([total[None], values]), axis=0)[-1] if len(values) else total


class Moments:
    """Running count, sum, sum of squares, min and max over the first axis, NaNs left out (float64; the sums in
    image order, `_added`)."""

    def __init__(self, shape: tuple[int, ...]):
        self.n, self.sum, self.sq = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        self.lo, self.hi = np.full(shape, np.inf), np.full(shape, -np.inf)

    def add(self, values: np.ndarray) -> None:
        v = values.astype(np.float64)
        seen = ~np.isnan(v)
        self.n += seen.sum(0)
        self.sum = _added(self.sum, np.where(seen, v, 0))
        self.sq = _added(self.sq, np.where(seen, v * v, 0))
        if len(v):
            self.lo = np.fmin(self.lo, np.nanmin(np.where(seen, v, np.inf), 0))
            self.hi = np.fmax(self.hi, np.nanmax(np.where(seen, v, -np.inf), 0))

    @property
    def mean(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.sum / self.n

    @property
    def std(self) -> np.ndarray:
        """Sample standard deviation (n - 1)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sqrt(np.maximum(self.sq - self.n * self.mean**2, 0) / (self.n - 1))

    @property
    def half_width(self) -> np.ndarray:
        """Half width of the normal 95% interval of the mean."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return Z95 * self.std / np.sqrt(self.n)


class Ratio:
    """The ratio of two running means over the first axis, sum(a) / sum(g), with a 95% interval by the delta
    method (from running sums of a, g, their squares and product; float64, in image order). For activation patching: a
    component's mean restored logit over the mean gap, the share of the gap it restores."""

    def __init__(self, shape: tuple[int, ...]):
        self.n = 0
        self.a, self.g, self.aa, self.gg, self.ag = (np.zeros(shape) for _ in range(5))

    def add(self, a: np.ndarray, g: np.ndarray) -> None:
        a = a.astype(np.float64)
        g = g.astype(np.float64).reshape((-1,) + (1,) * (a.ndim - 1))
        self.n += len(a)
        self.a = _added(self.a, a)
        self.g = _added(self.g, np.broadcast_to(g, a.shape))
        self.aa = _added(self.aa, a * a)
        self.gg = _added(self.gg, np.broadcast_to(g * g, a.shape))
        self.ag = _added(self.ag, a * g)

    @property
    def ratio(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.a / self.g

    @property
    def half_width(self) -> np.ndarray:
        """Half width of the 95% interval: var(r) ~ (s_aa - 2 r s_ag + r^2 s_gg) / (n mean(g)^2), s: sample
        (co)variances."""
        n, r = self.n, self.ratio
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_a, mean_g = self.a / n, self.g / n
            s_aa = (self.aa - n * mean_a**2) / (n - 1)
            s_gg = (self.gg - n * mean_g**2) / (n - 1)
            s_ag = (self.ag - n * mean_a * mean_g) / (n - 1)
            return Z95 * np.sqrt(np.maximum(s_aa - 2 * r * s_ag + r**2 * s_gg, 0) / (n * mean_g**2))


# the shards' patching arrays (`compute`) that are restored logits, each tallied as a share of the gap too
PATCHED = ("patch_branches", "patch_class_token", "patch_heads", "patch_tokens_best", "patch_tokens_top")


class TopK:
    """The k largest keys seen with their image index (a tie goes to the lower index): bounded memory."""

    def __init__(self, k: int):
        self.k, self.heap = k, []

    def add(self, keys: np.ndarray, index: np.ndarray) -> None:
        for key, i in zip(keys.tolist(), index.tolist()):
            if self.k and not math.isnan(key):
                heapq.heappush(self.heap, (key, -i))
                if len(self.heap) > self.k:
                    heapq.heappop(self.heap)

    def best(self) -> list[tuple[int, float]]:
        """(index, key), largest key first."""
        return [(-i, key) for key, i in sorted(self.heap, reverse=True)]


OUTCOMES = ("correct", "wrong")  # the split of every head number over labelled images: right and wrong predictions


@dataclass
class Tally:
    """What the files need from the shards, gathered in one pass."""

    layers: int
    heads: int
    classes: int
    exemplars: int
    moments: dict[str, Moments] = field(default_factory=dict)
    by_outcome: dict[str, dict[str, Moments]] = field(default_factory=dict)  # OUTCOMES -> head number -> moments
    ratios: dict[str, Ratio] = field(default_factory=dict)  # patching: each component's share of the gap
    class_dla: np.ndarray | None = None  # [classes, L, H] sums of the DLA per predicted class
    class_dla_sq: np.ndarray | None = None  # [classes, L, H] their sums of squares (the heatmap's intervals)
    class_count: np.ndarray | None = None  # [classes]
    confusion: np.ndarray | None = None  # [true, predicted] counts of the labelled images
    concentrated: list[TopK] = field(default_factory=list)  # per head (L * H): lowest entropy
    writing: list[TopK] = field(default_factory=list)  # per head: highest DLA
    context: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # exemplar -> label, prediction, p
    skipped: list[int] = field(default_factory=list)
    correct: int = 0
    labelled: int = 0

    def __post_init__(self) -> None:
        self.class_dla = np.zeros((self.classes, self.layers, self.heads))
        self.class_dla_sq = np.zeros((self.classes, self.layers, self.heads))
        self.class_count = np.zeros(self.classes)
        self.confusion = np.zeros((self.classes, self.classes), dtype=np.int64)
        self.by_outcome = {o: {} for o in OUTCOMES}
        self.concentrated = [TopK(self.exemplars) for _ in range(self.layers * self.heads)]
        self.writing = [TopK(self.exemplars) for _ in range(self.layers * self.heads)]

    def add(self, shard: dict[str, np.ndarray]) -> None:
        self.skipped += shard["skipped"].tolist()
        if "prediction" not in shard:
            return
        for key in (
            *HEAD_NUMBERS,
            "box_share",
            "distance",
            "knockout",
            "probability",
            *PATCHED,
            "patch_gap",
            BEST_IN_BOX,
        ):
            if key in shard:
                self.moments.setdefault(key, Moments(shard[key].shape[1:])).add(shard[key])
        for key in PATCHED if "patch_gap" in shard else ():
            self.ratios.setdefault(key, Ratio(shard[key].shape[1:])).add(shard[key], shard["patch_gap"])
        label, prediction = shard["label"], shard["prediction"]
        labelled = label >= 0
        self.labelled += int(labelled.sum())
        self.correct += int((label == prediction)[labelled].sum())
        np.add.at(self.confusion, (label[labelled], prediction[labelled]), 1)
        right = labelled & (label == prediction)
        for outcome, mask in zip(OUTCOMES, (right, labelled & ~right)):
            for key in HEAD_NUMBERS:
                if key in shard:
                    self.by_outcome[outcome].setdefault(key, Moments(shard[key].shape[1:])).add(shard[key][mask])
        np.add.at(self.class_dla, prediction, shard["dla"])
        np.add.at(self.class_dla_sq, prediction, shard["dla"].astype(np.float64) ** 2)
        np.add.at(self.class_count, prediction, 1)
        index = shard["index"]
        for h, (entropy, dla) in enumerate(
            zip(shard["entropy"].reshape(len(index), -1).T, shard["dla"].reshape(len(index), -1).T)
        ):
            self.concentrated[h].add(-entropy, index)
            self.writing[h].add(dla, index)
        self._keep_context(shard)

    def _keep_context(self, shard: dict[str, np.ndarray]) -> None:
        """Label, prediction and probability of the images that are exemplars so far (the page's captions)."""
        for i, label, prediction, p in zip(
            shard["index"].tolist(), shard["label"].tolist(), shard["prediction"].tolist(), shard["probability"]
        ):
            self.context[i] = (label, prediction, float(p))
        wanted = {i for top in (*self.concentrated, *self.writing) for i, _ in top.best()}
        self.context = {i: c for i, c in self.context.items() if i in wanted}

    def class_dla_interval(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean DLA per predicted class and head [classes, L, H] and the half width of its 95% interval (NaN
        for a class predicted fewer than twice)."""
        n = self.class_count[:, None, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = self.class_dla / n
            var = np.maximum(self.class_dla_sq - n * mean**2, 0) / (n - 1)
            return mean, np.where(n > 1, Z95 * np.sqrt(var / n), np.nan)


def shards_in_order(shards: list[Path]) -> Iterator[dict[str, np.ndarray]]:
    for path in shards:
        yield read_shard(path)


def image_columns(
    layers: int, heads: int, *, boxes: bool, blocks: list[str] | None, patched: list[str] | None = None
) -> list[str]:
    """images.csv's columns: the image, its true and predicted class by name, the probability and whether it
    was right; with boxes the box's share of the image (the chance level of its scores); per CA head its
    numbers; the knockouts and the patching when asked."""
    numbers = head_numbers(boxes)
    cols = ["path", "label", "prediction", "probability", "correct"] + (["box_share"] if boxes else [])
    cols += [f"{head_row(l, h)}_{m}" for l in range(layers) for h in range(heads) for m in numbers]
    cols += [f"knockout_{block_label(b)}" for b in blocks or []]
    if patched:
        cols.append("patching_gap")
        cols += [f"patching_{block_label(b)}_{part}" for b in patched for part in ("attention", "mlp")]
        cols += [f"patching_{block_label(b)}_class_token" for b in _class_token_blocks(patched)]
        cols += [f"patching_{head_row(l, h)}" for l in range(layers) for h in range(heads)]
        cols += ["patching_tokens_best", f"patching_tokens_top{TOKEN_TOP}", "patching_tokens_best_in_box"]
    return cols


def _class_token_blocks(names: list[str]) -> list[str]:
    """The CA blocks whose class token `explain.activation_patching` patches: all but the last (whose patch is
    the clean run by construction)."""
    return [n for n in names if n.startswith("blocks_token_only.")][:-1]


def _patching_cells(shard: dict[str, np.ndarray], j: int) -> list:
    """One image's patching in `image_columns` order: the gap, per block its attention and MLP, per CA block
    but the last its class token, per CA head, then the token patching's best patch, top patches together
    and the best patch's share in the box."""
    values = [shard["patch_gap"][j], *shard["patch_branches"][j].reshape(-1), *shard["patch_class_token"][j]]
    values += [*shard["patch_heads"][j].reshape(-1), shard["patch_tokens_best"][j], shard["patch_tokens_top"][j]]
    values.append(shard[BEST_IN_BOX][j])
    return [_cell(float(v)) for v in values]


def _image_rows(
    shard: dict[str, np.ndarray],
    paths: list[str],
    names: list[str],
    *,
    boxes: bool,
    knockouts: bool,
    patched: bool,
) -> Iterator[list]:
    numbers = head_numbers(boxes)
    for j, i in enumerate(shard.get("index", np.zeros(0, dtype=np.int64)).tolist()):
        label, prediction = int(shard["label"][j]), int(shard["prediction"][j])
        row = [paths[i], names[label] if label >= 0 else "", names[prediction], float(shard["probability"][j])]
        row.append("" if label < 0 else str(label == prediction))
        if boxes:
            row.append(_cell(float(shard["box_share"][j])))
        per_head = np.stack([shard[m][j] for m in numbers], axis=-1)  # [L, H, numbers]
        row += [_cell(v) for v in per_head.reshape(-1).tolist()]
        if knockouts:
            row += [_cell(v) for v in shard["knockout"][j].tolist()]
        if patched:
            row += _patching_cells(shard, j)
        yield row


def _cell(v: float) -> Any:
    return "" if math.isnan(v) else v


def write_images_csv(
    path: Path,
    shards: list[Path],
    *,
    paths: list[str],
    names: list[str],
    tally: Tally,
    boxes: bool,
    blocks: list[str] | None,
    patched: list[str] | None,
) -> None:
    """images.csv in image order, tallying every shard into `tally` on the way (one read of each shard).

    Args:
        shards: the shard files in image order. paths: every image's path; names: the model's class names.
            boxes: whether the data has boxes (the localisation columns). blocks: the knocked-out blocks (None:
            no knockouts). patched: the patched blocks (None: no patching)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(image_columns(tally.layers, tally.heads, boxes=boxes, blocks=blocks, patched=patched))
        for shard in shards_in_order(shards):
            tally.add(shard)
            flags = dict(boxes=boxes, knockouts=blocks is not None, patched=patched is not None)
            writer.writerows(_image_rows(shard, paths, names, **flags))


def write_skipped_csv(path: Path, skipped: list[tuple[str, str]]) -> None:
    """skipped.csv beside images.csv: each image that was not read, and why (path, reason)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "reason"])
        writer.writerows(skipped)


def head_rows(tally: Tally, class_names: list[str], *, boxes: bool) -> list[dict[str, Any]]:
    """One row per CA head: mean, std and 95% interval of the mean of each number, and on labelled data the
    mean and interval over the right and the wrong predictions apart; the mean DLA per predicted class."""
    numbers = head_numbers(boxes)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = tally.class_dla / tally.class_count[:, None, None]
    rows = []
    for l in range(tally.layers):
        for h in range(tally.heads):
            row: dict[str, Any] = {"head": head_row(l, h), "layer": l + 1, "head_in_layer": h + 1}
            for m in numbers:
                mo = tally.moments[m]
                mean, half = float(mo.mean[l, h]), float(mo.half_width[l, h])
                row |= {f"{m}_mean": mean, f"{m}_std": float(mo.std[l, h])}
                row |= {f"{m}_ci95_low": mean - half, f"{m}_ci95_high": mean + half, f"{m}_images": int(mo.n[l, h])}
            for outcome in OUTCOMES if tally.labelled else ():
                for m in numbers:
                    mo, name = tally.by_outcome[outcome][m], f"{m}_{outcome}"
                    mean, half = float(mo.mean[l, h]), float(mo.half_width[l, h])
                    row |= {f"{name}_mean": mean, f"{name}_ci95_low": mean - half, f"{name}_ci95_high": mean + half}
                    row[f"{name}_images"] = int(mo.n[l, h])
            if "patch_heads" in tally.ratios:
                row |= _patching_columns(tally, "patch_heads", (l, h))
            for c, name in enumerate(class_names):
                if tally.class_count[c]:
                    row[f"dla_mean_{name}"] = float(per_class[c, l, h])
            rows.append(row)
    return rows


def _patching_columns(tally: Tally, key: str, where) -> dict[str, float]:
    """heads.csv's patching columns of one head: its mean Δlogit and share of the gap, each with its interval
    (named as summary.json's `patching` names them, after "patching_")."""
    delta, share = _interval(tally.moments[key], where), _ratio(tally.ratios[key], where)
    return {
        "patching_delta_logit_mean": delta["mean"],
        "patching_delta_logit_ci95_low": delta["ci95"][0],
        "patching_delta_logit_ci95_high": delta["ci95"][1],
        "patching_restored": share["restored"],
        "patching_restored_ci95_low": share["restored_ci95"][0],
        "patching_restored_ci95_high": share["restored_ci95"][1],
    }


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows({k: _cell(v) if isinstance(v, float) else v for k, v in r.items()} for r in rows)


def histograms(shards: list[Path], tally: Tally, *, boxes: bool) -> dict[str, dict[str, Any]]:
    """Per number with a value, shared bin edges over all heads and the counts of each head [L, H, BINS] (a
    second read of the shards: the edges need the first pass's extremes). A localisation number of data whose
    boxes all lie outside the model's view has no value, so no histogram."""
    # a hit is 0 or 1: its rate is in the table
    numbers = [m for m in head_numbers(boxes) if m != "pointing" and tally.moments[m].n.any()]
    edges = {}
    for m in numbers:
        lo, hi = float(np.min(tally.moments[m].lo)), float(np.max(tally.moments[m].hi))
        edges[m] = np.linspace(lo, hi if hi > lo else lo + 1.0, BINS + 1)
    counts = {m: np.zeros((tally.layers, tally.heads, BINS), dtype=np.int64) for m in numbers}
    for shard in shards_in_order(shards):
        for m in numbers if "prediction" in shard else ():
            which = np.clip(np.searchsorted(edges[m], shard[m], side="right") - 1, 0, BINS - 1)
            valid = ~np.isnan(shard[m])
            for l in range(tally.layers):
                for h in range(tally.heads):
                    counts[m][l, h] += np.bincount(which[:, l, h][valid[:, l, h]], minlength=BINS)
    return {m: {"edges": edges[m].tolist(), "counts": counts[m].tolist()} for m in numbers}


def write_parquet(csv_path: Path) -> Path | None:
    """A parquet copy of a CSV written here (streamed batch by batch), when pyarrow is installed; else None."""
    try:
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq
    except ImportError:
        return None
    target = csv_path.with_suffix(".parquet")
    with open(csv_path, newline="") as f:
        header = next(csv.reader(f), [])
    if not header:  # no head was measured (no readable image): nothing to copy
        return None
    import pyarrow as pa

    text = ("path", "head", "label", "prediction")
    types = {c: pa.string() if c in text else pa.bool_() if c == "correct" else pa.float64() for c in header}
    types |= {c: pa.int64() for c in header if c in ("layer", "head_in_layer") or c.endswith("_images")}
    reader = pacsv.open_csv(csv_path, convert_options=pacsv.ConvertOptions(column_types=types))
    with pq.ParquetWriter(target, reader.schema) as writer:
        for batch in reader:
            writer.write_batch(batch)
    return target


def _interval(mo: Moments, where) -> dict[str, Any]:
    mean, half = float(mo.mean[where]), float(mo.half_width[where])
    return {"mean": _json(mean), "ci95": [_json(mean - half), _json(mean + half)]}


def _json(v: float) -> float | None:
    return None if math.isnan(v) else v


def _ratio(r: Ratio, where) -> dict[str, Any]:
    share, half = float(r.ratio[where]), float(r.half_width[where])
    return {"restored": _json(share), "restored_ci95": [_json(share - half), _json(share + half)]}


def _patched(tally: Tally, key: str, where) -> dict[str, Any]:
    """One component's patching over the images: mean Δlogit and share of the mean gap, with intervals."""
    delta = _interval(tally.moments[key], where)
    return {"delta_logit_mean": delta["mean"], "delta_logit_ci95": delta["ci95"], **_ratio(tally.ratios[key], where)}


def patching_entry(tally: Tally, names: list[str], corruption: tuple[str, int]) -> dict[str, Any]:
    """summary.json's `patching`: per block (attention and MLP branch, and for each CA block but the last its
    class token) and per CA head, what its clean output patched alone into the corrupted run restores of the
    predicted class's logit, averaged over the images: the mean Δlogit and the share of the mean gap, with 95%
    intervals; and the token patching into the class stage (`token_patching_entry`)."""
    parts = {"attention": ("patch_branches", (0,)), "MLP": ("patch_branches", (1,))}
    class_token = _class_token_blocks(names)
    return {
        "corruption": corruption[0],
        "severity": corruption[1],
        "target": "the class the model predicted on the clean image",
        "precision": "fp32",
        "intervals": "delta_logit: normal 95% interval of the mean; restored (mean Δlogit over the mean gap): "
        "95% interval by the delta method",
        "gap": _interval(tally.moments["patch_gap"], ()),
        "whole_stream": "orientation, not a measurement: the whole stream after any SA block, or the class token "
        "after the last CA block, patched into the corrupted run is the clean run, so it restores the gap",
        "blocks": [
            {
                "name": n,
                "label": block_label(n),
                **{k: _patched(tally, key, (b, *at)) for k, (key, at) in parts.items()},
                **(
                    {"class_token": _patched(tally, "patch_class_token", (class_token.index(n),))}
                    if n in class_token
                    else {}
                ),
            }
            for b, n in enumerate(names)
        ],
        "heads": [
            {"layer": l + 1, "head": h + 1, **_patched(tally, "patch_heads", (l, h))}
            for l in range(tally.layers)
            for h in range(tally.heads)
        ],
        "tokens": token_patching_entry(tally),
    }


def token_patching_entry(tally: Tally) -> dict[str, Any]:
    """summary.json's `patching.tokens`: the clean patch tokens at the class stage's input patched into the
    corrupted run one patch at a time; over the images, what the best patch restores alone and the `TOKEN_TOP`
    best together (mean Δlogit and share of the mean gap, with intervals), and the mean share of the best
    patch's area inside the object's box."""
    box = tally.moments[BEST_IN_BOX]
    return {
        "region_patches": TOKEN_REGION,
        "top": TOKEN_TOP,
        "best": _patched(tally, "patch_tokens_best", ()),
        "top_together": _patched(tally, "patch_tokens_top", ()),
        "best_in_box": {**_interval(box, ()), "images": int(box.n)},
    }


def head_entries(tally: Tally, paths: list[str], *, boxes: bool) -> list[dict[str, Any]]:
    """summary.json's `heads`: per CA head (numbered from 1) the mean of each number with its interval and the
    images it is over (named as in heads.csv: `<number>_mean`, `<number>_ci95`, `<number>_images`), on labelled
    data also over the right and the wrong predictions apart (`<number>_correct_mean`, ...), and its exemplars."""
    entries = []
    for l in range(tally.layers):
        for h in range(tally.heads):
            k, entry = l * tally.heads + h, {"layer": l + 1, "head": h + 1}
            for m in HEAD_NUMBERS:
                stats = _interval(tally.moments[m], (l, h)) if m in head_numbers(boxes) else {}
                entry |= {f"{m}_mean": stats.get("mean"), f"{m}_ci95": stats.get("ci95")}
                entry[f"{m}_images"] = int(tally.moments[m].n[l, h]) if m in head_numbers(boxes) else 0
            for outcome in OUTCOMES if tally.labelled else ():
                for m in head_numbers(boxes):
                    mo, name = tally.by_outcome[outcome][m], f"{m}_{outcome}"
                    stats = _interval(mo, (l, h))
                    entry |= {f"{name}_mean": stats["mean"], f"{name}_ci95": stats["ci95"]}
                    entry[f"{name}_images"] = int(mo.n[l, h])
            entry["exemplars"] = {
                "concentrated": [{"path": paths[i], "entropy": -v} for i, v in tally.concentrated[k].best()],
                "writes": [{"path": paths[i], "dla": v} for i, v in tally.writing[k].best()],
            }
            entries.append(entry)
    return entries


def class_entries(tally: Tally, names: list[str]) -> dict[str, Any]:
    """summary.json's `per_class` (per true class with labelled images: its images, top-1, and the class it
    is most often mistaken for) and `confusion` (true x predicted counts over the classes that occur)."""
    per_class = {}
    for c in np.flatnonzero(tally.confusion.sum(1)).tolist():
        row, n = tally.confusion[c], int(tally.confusion[c].sum())
        wrong = row.copy()
        wrong[c] = 0
        entry = {"images": n, "top1": float(row[c] / n), "mistaken_for": None, "mistaken_images": 0}
        if wrong.any():
            entry |= {"mistaken_for": names[int(wrong.argmax())], "mistaken_images": int(wrong.max())}
        per_class[names[c]] = entry
    seen = np.flatnonzero(tally.confusion.sum(0) + tally.confusion.sum(1)).tolist()
    confusion = {"classes": [names[c] for c in seen], "counts": tally.confusion[np.ix_(seen, seen)].tolist()}
    return {"per_class": per_class, "confusion": confusion}


def box_line(entry: dict[str, Any]) -> str:
    """summary.json's `boxes` in one line (the log's and the page's): what is scored, what was left out and why."""
    line = BoxCount(entry["images_with_box"], entry["left_out"]).line()
    return line + (f"; {entry['no_scores']}" if entry.get("no_scores") else "")


def box_entry(tally: Tally, count: BoxCount | None, boxes: np.ndarray) -> dict[str, Any]:
    """summary.json's `boxes`: how many readable images had a box the model sees (the images every
    localisation score is over), what was left out and why (the reader's count, and the boxes of images that
    opened but could not be decoded, `boxes` [N, 4] NaN rows without), and the chance level of the pointing
    game and the mass in the box (the mean box share of the image, with its interval)."""
    share = tally.moments.get("box_share")
    scored = 0 if share is None else int(share.n)
    left = Counter(count.left_out if count else {})
    left["unreadable"] += int((~np.isnan(boxes[sorted(tally.skipped)]).any(-1)).sum()) if tally.skipped else 0
    entry = {"images_with_box": scored, "left_out": {k: left[k] for k in LEFT_OUT if left[k]}}
    entry["left_out_reasons"] = {k: LEFT_OUT[k] for k in entry["left_out"]}
    stats = _interval(share, ()) if scored else {"mean": None, "ci95": None}
    entry |= {"box_share_mean": stats["mean"], "box_share_ci95": stats["ci95"]}
    return entry | ({} if scored else {"no_scores": NO_BOX_IN_VIEW})


# why the localisation columns of an atlas are empty when boxes were given but none lies in the model's view
NO_BOX_IN_VIEW = "no image has a box in the model's view: the pointing and mass-in-box columns are empty"


def block_entries(tally: Tally, names: list[str], gamma: list[float]) -> list[dict[str, Any]]:
    """summary.json's `blocks`: per block its mean logit change when knocked out (with a 95% interval over
    the images) and its mean |gamma|."""
    mo = tally.moments["knockout"]
    return [
        {
            "name": n,
            "label": block_label(n),
            **{f"logit_change_{k}": v for k, v in _interval(mo, b).items()},
            "gamma_mean_abs": g,
        }
        for b, (n, g) in enumerate(zip(names, gamma))
    ]
