"""A comparison of two finished atlases of the same images (`python -m cait.compare --atlas-a A --atlas-b B`):
the answers and every head's per-image numbers come from each atlas's images.csv, the models (their grids, and the
page's maps of the disagreements) from the arguments each atlas records (atlas_args.json). An atlas keeps neither
block representations nor maps, so such a comparison has no CKA and no head similarity: its heads are paired by
layer and head."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from ..atlas.compute import HEAD_NUMBERS
from ..atlas.run import ready_out
from ..atlas.shards import ARGS_FILE
from ..data import read_images
from ..explain.metrics import head_row
from ..factory import load_from_flags
from .merge import write_merged
from .options import CompareError, CompareOptions, check_comparable

MODEL_FLAGS = ("model", "checkpoint", "pretrained", "random_init")


def read_atlas(folder: Path) -> tuple[dict, list[dict]]:
    """An atlas's recorded arguments and images.csv's rows; CompareError (one line) for a folder without them."""
    try:
        args = json.loads((folder / ARGS_FILE).read_text())
        with open(folder / "images.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, ValueError) as e:
        raise CompareError(f"{folder} holds no finished atlas ({type(e).__name__}: {e})") from None
    return args, rows


def same_images(rows_a: list[dict], rows_b: list[dict], folders: tuple[Path, Path]) -> None:
    """CompareError unless the two atlases hold the same images in the same order."""
    paths_a, paths_b = [r["path"] for r in rows_a], [r["path"] for r in rows_b]
    if paths_a != paths_b:
        first = next((f"{x!r} against {y!r}" for x, y in zip(paths_a, paths_b) if x != y), "one list is longer")
        raise CompareError(
            f"the two atlases are of other images ({folders[0]}: {len(paths_a)} images, {folders[1]}: "
            f"{len(paths_b)}; first difference: {first}): compare atlases of the same images"
        )


def _number(cell: str | None) -> float:
    return float(cell) if cell else np.nan


def side_arrays(rows: list[dict], key: str, names: list[str], cfg) -> dict[str, np.ndarray]:
    """One atlas's rows as a comparison's per-image arrays of side `key` (prediction, box share, per head
    [n, L, H] each of the atlas's numbers; NaN where the atlas has none)."""
    shape = (len(rows), cfg.depth_token_only, cfg.num_heads)
    out = {f"{key}_prediction": np.array([names.index(r["prediction"]) for r in rows])}
    out[f"{key}_box_share"] = np.array([_number(r.get("box_share")) for r in rows])
    for number in HEAD_NUMBERS:
        columns = [f"{head_row(l, h)}_{number}" for l in range(shape[1]) for h in range(shape[2])]
        out[f"{key}_{number}"] = np.array([[_number(r.get(c)) for c in columns] for r in rows]).reshape(shape)
    return out


def compare_atlases(options: CompareOptions) -> Path:
    """The comparison of options.atlas_a with options.atlas_b, written to options.out (see the module)."""
    folders = (Path(options.atlas_a), Path(options.atlas_b))
    (args_a, rows_a), (args_b, rows_b) = read_atlas(folders[0]), read_atlas(folders[1])
    same_images(rows_a, rows_b, folders)
    loaded = [load_from_flags(argparse.Namespace(**{k: args.get(k) for k in MODEL_FLAGS})) for args in (args_a, args_b)]
    names = check_comparable(*(side.model for side in loaded))
    data = [
        read_images(
            args["data"],
            side.model.cfg,
            boxes=args.get("boxes"),
            limit=args.get("limit"),
            sample=args.get("sample", "stratified"),
            normalise=False,
        )
        for args, side in zip((args_a, args_b), loaded)
    ]
    position = {p: i for i, p in enumerate(data[0].paths)}
    arrays = {
        "index": np.array([position[r["path"]] for r in rows_a]),
        "label": np.array([names.index(r["label"]) if r["label"] else -1 for r in rows_a]),
        **side_arrays(rows_a, "a", names, loaded[0].model.cfg),
        **side_arrays(rows_b, "b", names, loaded[1].model.cfg),
    }
    out = Path(options.out)
    lock = ready_out(out, what="comparison")
    try:
        write_merged(out, loaded, data, names, arrays, options=options, by_position=True)
    finally:
        lock.release()
    return out
