"""The example images shipped in cait/examples/, each with its label and box from examples.json."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"


@dataclass(frozen=True)
class ExampleImage:
    """An image file and, when an examples.json beside it lists the file, its label and box."""

    path: Path
    label: int | None = None  # true class index
    class_name: str | None = None  # its name, as examples.json spells it
    box: tuple[float, float, float, float] | None = None  # (x0, y0, x1, y1) in the image file's pixels

    @property
    def caption(self) -> str:
        return f"true: {self.class_name}" if self.class_name else self.path.stem


def _annotations(directory: Path) -> dict[str, dict]:
    # examples.json (scripts/export_examples.py): {"canvas": side, "examples": [{"file", "label", "class",
    # "box_xyxy"}, ...]}; a missing or unreadable file means plain images without labels.
    try:
        data = json.loads((directory / "examples.json").read_text())
        return {e["file"]: e for e in data.get("examples", [])}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}


def read_examples(paths: Iterable[str | os.PathLike] | None = None) -> list[ExampleImage]:
    """`paths` (default: the images shipped in cait/examples/: the example scenes, then the product-style photos,
    each sorted by name), each with its label and box when an examples.json in its folder lists it."""
    if paths is None:
        files = sorted(EXAMPLES_DIR.glob("scene_*.png")) + sorted(EXAMPLES_DIR.glob("product_*.png"))
    else:
        files = [Path(p) for p in paths]
    notes: dict[Path, dict[str, dict]] = {}
    out = []
    for f in files:
        note = notes.setdefault(f.parent, _annotations(f.parent)).get(f.name, {})
        box = note.get("box_xyxy")
        out.append(
            ExampleImage(
                path=f,
                label=note.get("label"),
                class_name=note.get("class"),
                box=tuple(float(v) for v in box) if box else None,
            )
        )
    return out
