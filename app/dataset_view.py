"""The Dataset tab's parts: a head atlas folder (`python -m cait.atlas`: summary.json, heads.csv, atlas.html)
read into what the tab shows (per CA head its numbers and exemplars, the heads x classes DLA heatmap). Plain
functions, no Gradio (`app.tabs.dataset` is the tab)."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

import cait
from cait.atlas.page import class_dla_figure
from cait.atlas.shards import ARGS_FILE
from cait.data import ImageSet, read_images, split_name
from cait.errors import InputError
from cait.explain.metrics import head_row
from cait.figures import head_name

DEFAULT_SCENES, MAX_SCENES = 200, 2000  # an atlas built in the app: N shipped scenes of the val split
SCENES, SPLIT = "fashion-mnist-scenes", "val"  # what the app builds atlases of (the atlas's own default split)
SCENES_SAID = split_name(SCENES, SPLIT)  # the name the reader gives them
BUILT_SHARD = 64  # images per shard of an atlas built in the app: what a Stop loses at most (a multiple of the
# batch of 64, so that every batch, and every number, is the command line's)
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
OUTCOMES = ("all", "right", "wrong")  # the exemplar filter on the prediction (labelled images only)
ALL_CLASSES = "all classes"
ZIPPED = ("summary.json", "heads.csv", "images.csv", "skipped.csv", "atlas.html", ARGS_FILE)  # the download


class NotAnAtlas(InputError):
    """A folder the tab cannot open as an atlas; the message is one line saying why."""


@dataclass(frozen=True)
class Context:
    """What images.csv says of an image: its true class ("" when unlabelled), the predicted one, its probability."""

    true: str
    predicted: str
    probability: float

    def words(self) -> str:
        said = f"predicted {self.predicted} ({self.probability:.2f})"
        if not self.true:
            return said
        return f"{'right' if self.true == self.predicted else 'wrong'}: true {self.true}, {said}"


@dataclass(frozen=True)
class Exemplar:
    kind: str  # KINDS' label
    path: str  # as the atlas names it: relative to its data folder, or "<dataset>/<split>/<index>"
    value: float  # the entropy or DLA it was chosen by
    number: str  # which of the two
    context: Context | None = None  # None: an atlas without images.csv

    @property
    def caption(self) -> str:
        said = f"{self.kind}: {Path(self.path).name} · {self.number} {self.value:.3g}"
        return said if self.context is None else f"{said} · {self.context.words()}"


@dataclass
class ImageTable:
    """images.csv's columns the exemplar filter needs: per image its path, classes and per head its entropy and
    DLA ([images, heads], heads in summary order)."""

    paths: list[str]
    true: list[str]
    predicted: list[str]
    probability: np.ndarray
    entropy: np.ndarray
    dla: np.ndarray
    where: dict[str, int] = field(default_factory=dict)  # path -> row

    def context(self, path: str) -> Context | None:
        i = self.where.get(path)
        return None if i is None else Context(self.true[i], self.predicted[i], float(self.probability[i]))

    def chosen(self, cls: str | None, outcome: str) -> np.ndarray:
        """The rows of class `cls` (the true class, or the predicted one of an unlabelled image; None: every
        class) and prediction `outcome` (OUTCOMES; right and wrong only of labelled images)."""
        true, predicted = np.array(self.true, dtype=object), np.array(self.predicted, dtype=object)
        keep = np.ones(len(self.paths), dtype=bool)
        if cls is not None:
            keep &= np.where(true != "", true, predicted) == cls
        if outcome != OUTCOMES[0]:
            keep &= (true != "") & ((true == predicted) == (outcome == "right"))
        return np.flatnonzero(keep)


def read_image_table(path: Path, heads: list[dict[str, Any]]) -> ImageTable | None:
    """images.csv as an `ImageTable` (None when the atlas has none: made before the file had class names)."""
    keys = [head_row(e["layer"] - 1, e["head"] - 1) for e in heads]
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise NotAnAtlas(f"{path} is unreadable ({e.strerror or e}): make the atlas again") from None
    if rows and any(f"{k}_dla" not in rows[0] for k in keys):
        return None
    column = lambda name: np.array([_number(r[name]) for r in rows], dtype=float).reshape(len(rows))  # noqa: E731
    per_head = lambda number: np.stack([column(f"{k}_{number}") for k in keys], 1).reshape(len(rows), len(keys))  # noqa: E731
    paths = [r["path"] for r in rows]
    return ImageTable(
        paths,
        [r["label"] for r in rows],
        [r["prediction"] for r in rows],
        column("probability"),
        per_head("entropy"),
        per_head("dla"),
        {p: i for i, p in enumerate(paths)},
    )


def top_rows(values: np.ndarray, rows: np.ndarray, k: int) -> list[int]:
    """The k rows of `rows` with the largest values, largest first, ties to the lower row (the atlas's TopK rule),
    NaNs left out."""
    found = [(float(values[i]), -int(i)) for i in rows if not math.isnan(values[i])]
    return [-i for _, i in sorted(found, reverse=True)[:k]]


@dataclass(frozen=True)
class Atlas:
    """An atlas as written by `python -m cait.atlas`: its summary, the arguments it was made with, heads.csv."""

    folder: Path
    summary: dict[str, Any]
    args: dict[str, Any]  # atlas_args.json: the data and the model it was made from ({} when missing)
    rows: list[dict[str, str]]  # heads.csv, one row per CA head, in summary["heads"] order
    table: ImageTable | None = None  # images.csv (None: an atlas without it)

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

    def exemplars(self, k: int, cls: str | None = None, outcome: str = OUTCOMES[0]) -> list[Exemplar]:
        """Head k's exemplars, the most concentrated maps first, then the images it writes most to: the atlas's
        own, or with a filter (of class `cls`, of right or wrong predictions: `ImageTable.chosen`) the same rule
        over images.csv's rows that pass it."""
        found, t = self.heads[k]["exemplars"], self.table
        context = (lambda path: None) if t is None else t.context  # noqa: E731
        if (cls is None and outcome == OUTCOMES[0]) or t is None:
            return [
                Exemplar(label, e["path"], e[number], number, context(e["path"]))
                for kind, label, number in KINDS
                for e in found[kind]
            ]
        rows, out = t.chosen(cls, outcome), []
        for kind, label, number in KINDS:
            values = t.entropy[:, k] if number == "entropy" else t.dla[:, k]
            best = top_rows(-values if number == "entropy" else values, rows, len(found[kind]))
            out += [Exemplar(label, t.paths[i], float(values[i]), number, context(t.paths[i])) for i in best]
        return out

    def filter_classes(self) -> list[str]:
        """The classes the exemplars can be filtered by: those of images.csv, in the model's order of heads.csv."""
        if self.table is None:
            return []
        seen = set(self.table.true) | set(self.table.predicted)
        named = [c for c in self.summary.get("confusion", {}).get("classes", []) if c in seen]
        return named + sorted(seen - set(named) - {""})

    def made_by(self, made_from: str) -> bool:
        """Whether the atlas's model is the one `made_from` describes (`cait.SourcedModel.made_from`, the one record
        of the weights: their file with its architecture and training and the weights' identity, a hash of their
        content, or the seeded random init): the same weights, however the server was started; a file trained
        again at the same path is another model."""
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
    table = read_image_table(folder / "images.csv", summary["heads"])
    return Atlas(folder, summary, args if isinstance(args, dict) else {}, rows, table)


def built_folder(root: Path, model: str, made_from: str, scenes: int) -> Path:
    """Where the app builds the atlas of `scenes` scenes for a model: one folder per model and count (its name
    and a hash of its weights' record), so that building it again continues a stopped build."""
    digest = hashlib.sha256(made_from.encode()).hexdigest()[:8]
    return root / f"{model.replace('/', '_')}-{digest}-{SPLIT}-scenes{scenes}"


def zip_atlas(atlas: Atlas, into: Path) -> Path:
    """The atlas's files (not its shards) as one zip in the folder `into`, for the tab's download."""
    path = into / f"{atlas.folder.name}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name in ZIPPED:
            if (atlas.folder / name).is_file():
                z.write(atlas.folder / name, f"{atlas.folder.name}/{name}")
    return path


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
    # the images per column its title promises: counted from images.csv's predictions, as the atlas's page has them
    counts = None if atlas.table is None else [atlas.table.predicted.count(c) for c in classes]
    return class_dla_figure(z, rows, classes, counts=counts)


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


SPLIT_NAMES = {"entropy": "entropy", "dla": "DLA", "pointing": "pointing", "mass_in_box": "mass in box"}


def heads_split(atlas: Atlas) -> tuple[list[str], list[list]]:
    """Every head's numbers over the right and over the wrong predictions apart, and wrong minus right (the
    atlas's `<number>_correct_mean`, `<number>_wrong_mean`, as heads.csv has them): does a head look elsewhere
    when the model is wrong? (headers, one row per head in `heads` order); no column without the split (an atlas
    of unlabelled images: ([], []))."""
    first = atlas.heads[0] if atlas.heads else {}
    numbers = [m for m in SPLIT_NAMES if first.get(f"{m}_correct_mean") is not None]
    if not numbers:
        return [], []
    headers = ["head"] + [f"{SPLIT_NAMES[m]} {g}" for m in numbers for g in ("right", "wrong", "wrong − right")]
    rows = []
    for e in atlas.heads:
        row: list = [head_name(e["layer"] - 1, e["head"] - 1)]
        for m in numbers:
            right, wrong = e.get(f"{m}_correct_mean"), e.get(f"{m}_wrong_mean")
            apart = None if right is None or wrong is None else wrong - right
            row += [_shown(right), _shown(wrong), _shown(apart)]
        rows.append(row)
    return headers, rows


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
    "Context",
    "DEFAULT_SCENES",
    "Exemplar",
    "ImageTable",
    "MAX_SCENES",
    "NotAnAtlas",
    "atlas_images",
    "built_folder",
    "class_numbers",
    "find_atlases",
    "head_numbers",
    "heatmap",
    "overview_markdown",
    "read_atlas",
    "read_image_table",
    "top_rows",
    "zip_atlas",
]
