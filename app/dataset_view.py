"""The Dataset tab's parts: a head atlas folder (`python -m cait.atlas`: summary.json, heads.csv, atlas.html)
read into what the tab shows (per CA head its numbers and exemplars, the heads x classes DLA heatmap). Plain
functions, no Gradio (`app.tabs.dataset` is the tab)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

import cait
from cait.atlas.page import class_dla_figure
from cait.atlas.shards import ARGS_FILE
from cait.data import ImageSet, read_images
from cait.errors import InputError
from cait.figures.attention import head_name

DEFAULT_SCENES, MAX_SCENES = 200, 2000  # an atlas built in the app: the first N shipped test scenes
SCENES = "fashion-mnist-scenes"
CLASS_PREFIX = "dla_mean_"  # heads.csv: the mean DLA of a head over the images predicted as the class after it
# (what summary.json calls each number of a head, its interval, and how the tab names it)
NUMBERS = (
    ("entropy_mean", "entropy_ci95", "map entropy (nats)"),
    ("dla_mean", "dla_ci95", "direct logit attribution"),
    ("pointing_mean", "pointing_ci95", "pointing game (hit rate)"),
    ("mass_in_box_mean", "mass_in_box_ci95", "attention mass in the box"),
)
NUMBER_HEADERS = ["number", "mean", "95% low", "95% high"]
CLASS_HEADERS = ["predicted class", "mean DLA"]
DIGITS = 4  # decimals shown in the tables (the files keep every digit)
# exemplar kinds in summary.json: (key, what the gallery calls it, the number it was chosen by)
KINDS = (("concentrated", "most concentrated", "entropy"), ("writes", "writes most", "dla"))


class NotAnAtlas(InputError):
    """A folder the tab cannot open as an atlas; the message is one line saying why."""


@dataclass(frozen=True)
class Exemplar:
    kind: str  # KINDS' label
    path: str  # as the atlas names it: relative to its data folder, or "<dataset>/<split>/<index>"
    value: float  # the entropy or DLA it was chosen by
    number: str  # which of the two

    @property
    def caption(self) -> str:
        return f"{self.kind}: {Path(self.path).name} · {self.number} {self.value:.3g}"


@dataclass(frozen=True)
class Atlas:
    """An atlas as written by `python -m cait.atlas`: its summary, the arguments it was made with, heads.csv."""

    folder: Path
    summary: dict[str, Any]
    args: dict[str, Any]  # atlas_args.json: the data and the model it was made from ({} when missing)
    rows: list[dict[str, str]]  # heads.csv, one row per CA head, in summary["heads"] order

    @property
    def heads(self) -> list[dict[str, Any]]:
        return self.summary["heads"]

    def head_choices(self) -> list[tuple[str, int]]:
        """(label numbered from 1, index into `heads`) of every CA head."""
        return [(head_name(e["layer"] - 1, e["head"] - 1), k) for k, e in enumerate(self.heads)]

    def classes(self) -> list[str]:
        """The classes some image was predicted as (heads.csv's per-class columns)."""
        return [c[len(CLASS_PREFIX) :] for c in (self.rows[0] if self.rows else {}) if c.startswith(CLASS_PREFIX)]

    def columns(self) -> int:
        """Exemplar tiles per row: one row per kind, at least 6 (a few tiles are not shown page-wide)."""
        found = self.heads[0]["exemplars"] if self.heads else {}
        return max(6, *(len(v) for v in found.values()))

    def exemplars(self, k: int) -> list[Exemplar]:
        """Head k's exemplars: the most concentrated maps first, then the heads that write most."""
        found = self.heads[k]["exemplars"]
        return [Exemplar(label, e["path"], e[number], number) for kind, label, number in KINDS for e in found[kind]]

    def made_by(self, made_from: str) -> bool:
        """Whether the atlas's model is the one `made_from` describes (`cait.SourcedModel.made_from`, the one record
        of the weights: their file with its architecture and training, or the seeded random init): the same
        weights, however the server was started."""
        return self.summary.get("model") == made_from


def _json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise NotAnAtlas(f"{path.parent} holds no {path.name}: not an atlas (make one with python -m cait.atlas)")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise NotAnAtlas(f"{path} is unreadable ({type(e).__name__}): {what}") from None


def read_atlas(folder: str | Path) -> Atlas:
    """The atlas in `folder`; NotAnAtlas (one line) for a folder that is not one or whose files are damaged."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotAnAtlas(f"{folder} is not a folder")
    summary = _json(folder / "summary.json", "the atlas is damaged; make it again")
    needed = ("data", "model", "images", "heads")
    if not isinstance(summary, dict) or any(k not in summary for k in needed):
        raise NotAnAtlas(f"{folder / 'summary.json'} is not an atlas's summary (it needs {', '.join(needed)})")
    args = _json(folder / ARGS_FILE, "the atlas's arguments are damaged") if (folder / ARGS_FILE).exists() else {}
    try:
        with open(folder / "heads.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise NotAnAtlas(f"{folder / 'heads.csv'} is unreadable ({e.strerror or e}): make the atlas again") from None
    if len(rows) != len(summary["heads"]):
        raise NotAnAtlas(f"{folder}: heads.csv and summary.json disagree on the heads; make the atlas again")
    return Atlas(folder, summary, args if isinstance(args, dict) else {}, rows)


def find_atlases(root: str | Path | None) -> list[Path]:
    """`root` and its subfolders that hold a summary.json (opening one says if it is not an atlas's)."""
    if root is None or not Path(root).is_dir():
        return []
    root = Path(root)
    return [p.parent for p in ([root / "summary.json"] if (root / "summary.json").is_file() else [])] + [
        p.parent for p in sorted(root.glob("*/summary.json"))
    ]


def overview_markdown(atlas: Atlas) -> str:
    """What the atlas is: its data, model, image count, top-1, skipped files, and a link to its page."""
    s = atlas.summary
    top1 = "" if s.get("top1") is None else f", top-1 **{s['top1']:.1%}** over {s.get('labelled', 0):,} labelled"
    skipped = len(s.get("skipped") or [])
    lines = [
        f"**Data:** {s['data']}  \n**Model:** {s['model']}",
        f"**{s['images']:,} images**{top1}" + (f"; {skipped} unreadable skipped" if skipped else "") + ".",
    ]
    if (atlas.folder / "atlas.html").is_file():
        lines.append(f"[Open the atlas's own page (atlas.html)](/gradio_api/file={(atlas.folder / 'atlas.html')})")
    return "\n\n".join(lines)


def heatmap(atlas: Atlas):
    """Heads x predicted classes, the mean DLA, from heads.csv (the figure of atlas.html); None without images."""
    classes = atlas.classes()
    if not classes:
        return None
    z = np.array([[_number(r[CLASS_PREFIX + c]) for c in classes] for r in atlas.rows], dtype=float)
    rows = [head_name(e["layer"] - 1, e["head"] - 1) for e in atlas.heads]
    return class_dla_figure(z, rows, classes)


def _number(cell: str) -> float:
    return float(cell) if cell != "" else math.nan


def head_numbers(atlas: Atlas, k: int) -> list[list]:
    """Head k's numbers over the data as table rows (number, mean, 95% interval); localisation only with boxes."""
    entry = atlas.heads[k]
    return [
        [label, *(_shown(v) for v in (entry[mean], *(entry[ci] or (None, None))))]
        for mean, ci, label in NUMBERS
        if entry.get(mean) is not None
    ]


def _shown(v: float | None) -> float | None:
    return None if v is None else round(v, DIGITS)


def class_numbers(atlas: Atlas, k: int) -> list[list]:
    """Head k's mean DLA per predicted class (heads.csv), largest first."""
    row = atlas.rows[k]
    found = [[c, _shown(_number(row[CLASS_PREFIX + c]))] for c in atlas.classes() if row[CLASS_PREFIX + c] != ""]
    return sorted(found, key=lambda r: -r[1])


@lru_cache(maxsize=4)
def _data(data: str, limit: int | None, sample: str, cfg: cait.CaiTConfig) -> tuple[ImageSet, dict[str, int]]:
    images = read_images(data, cfg, limit=limit, sample=sample, normalise=False)
    return images, {p: i for i, p in enumerate(images.paths)}


def atlas_images(atlas: Atlas, cfg: cait.CaiTConfig) -> tuple[ImageSet, dict[str, int]]:
    """The atlas's data as the reader reads it (for its exemplars' pixels) and each path's index. Raises
    DataError (one line) when the data cannot be read here, NotAnAtlas when the atlas does not say its data."""
    if "data" not in atlas.args:
        raise NotAnAtlas(f"{atlas.folder} holds no {ARGS_FILE}: the atlas does not say where its images are")
    return _data(atlas.args["data"], atlas.args.get("limit"), atlas.args.get("sample", "stratified"), cfg)


__all__ = [
    "Atlas",
    "DEFAULT_SCENES",
    "Exemplar",
    "MAX_SCENES",
    "NotAnAtlas",
    "atlas_images",
    "class_numbers",
    "find_atlases",
    "head_numbers",
    "heatmap",
    "overview_markdown",
    "read_atlas",
]
