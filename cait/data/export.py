"""Write Fashion-MNIST scenes to disk as an ImageFolder with COCO boxes, for testing dataset features on real
files and for using the scenes in other tools:

    python -m cait.data.export DIR --n N [--split val] [--style default|varied] [--seed S]

DIR/<class>/<index>.png (lossless, the scene's canvas size; index = the scene's index in the split, 5 digits)
and DIR/boxes.json (COCO: the 10 Fashion-MNIST classes as categories 1-10, bbox [x, y, w, h] in canvas
pixels), written last: while the images are written the boxes are in DIR/.export-unfinished.json, so an
interrupted export has no boxes.json and `cait.data.read_images` warns that it is unfinished.
`cait.data.read_images(DIR, cfg, boxes=DIR/boxes.json)` reads them back as the scenes themselves.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tqdm import tqdm

from ..errors import InputError
from .names import SCENE_STYLES, SPLIT_FILES, UNFINISHED_EXPORT, DataError

if TYPE_CHECKING:
    from .scenes import FashionMNISTScenes

BOXES_FILE = "boxes.json"
MARK = "Fashion-MNIST scenes written by cait.data.export"  # COCO info.description: how a previous export is known


def coco_boxes(scenes: FashionMNISTScenes, files: list[str]) -> dict:
    """The COCO document of scenes 0..len(files)-1 written as `files` (relative paths): one box per scene."""
    info = {"description": MARK, "split": scenes.split, "seed": scenes.seed, "style": scenes.style}
    return coco_document(files, scenes.boxes, scenes.labels, scenes.classes, canvas=scenes.canvas, info=info)


def coco_document(files: list[str], boxes, labels, classes, *, canvas: int, info: dict) -> dict:
    """COCO for square canvas images `files` with one (x0, y0, x1, y1) box and class index each; categories 1..K."""
    categories = [{"id": k + 1, "name": name} for k, name in enumerate(classes)]
    images, annotations = [], []
    for i, file in enumerate(files):
        x0, y0, x1, y1 = (float(v) for v in boxes[i])
        images.append({"id": i, "file_name": file, "width": canvas, "height": canvas})
        annotations.append(
            {
                "id": i,
                "image_id": i,
                "category_id": int(labels[i]) + 1,
                "bbox": [x0, y0, x1 - x0, y1 - y0],
                "area": (x1 - x0) * (y1 - y0),
                "iscrowd": 0,
            }
        )
    return {"info": info, "images": images, "annotations": annotations, "categories": categories}


def clear_previous(out: Path, *, mark: str = MARK) -> None:
    """Make `out` ready to write: absent or empty, or a previous export (its COCO info.description is `mark`),
    whose files are removed (so that a smaller export leaves none of them behind). Anything else: DataError, and
    nothing is touched."""
    if not out.exists():
        return
    if not out.is_dir():
        raise DataError(f"{out} is a file, not a directory")
    if not any(out.iterdir()):
        return
    previous = _previous_export(out, mark)
    if previous is None:
        raise DataError(f"{out} is not empty and not a previous export: choose a new or empty directory")
    for file in previous:
        file.unlink(missing_ok=True)
    (out / BOXES_FILE).unlink(missing_ok=True)
    (out / UNFINISHED_EXPORT).unlink(missing_ok=True)
    for folder in out.iterdir():
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def _previous_export(out: Path, mark: str) -> list[Path] | None:
    """The image files a previous export marked `mark` (finished or interrupted) in `out` wrote, None when it is
    not one."""
    for name in (BOXES_FILE, UNFINISHED_EXPORT):
        try:
            previous = json.loads((out / name).read_text())
            if previous["info"]["description"] == mark:
                return [out / image["file_name"] for image in previous["images"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def export_scenes(out: Path, *, n: int, split: str = "val", style: str = "default", seed: int = 0) -> int:
    """Write the first n scenes of a split under `out` (see the module's doc); returns how many (the split may
    hold fewer)."""
    from .scenes import FashionMNISTScenes  # here, not at the top: the command's --help needs no torch

    if n <= 0:
        raise DataError(f"--n must be positive, got {n}")
    prepare_folder(out, mark=MARK)
    scenes = FashionMNISTScenes(split, seed=seed, subset=n, style=style)
    files = class_files(scenes.labels, scenes.classes)
    write_image_folder(out, files, coco_boxes(scenes, files), lambda i: scenes[i][0], unit="scene")
    return len(files)


def prepare_folder(out: Path, *, mark: str) -> None:
    """Clear a previous export marked `mark` from `out` and check that it can be written, before any image is drawn."""
    from ..outputs import writable_folder

    clear_previous(out, mark=mark)
    writable_folder(out)


def class_files(labels, classes) -> list[str]:
    """The ImageFolder file of image i: <its class's folder>/<i, 5 digits>.png."""
    from .reader import folder_name

    return [f"{folder_name(classes[int(label)])}/{i:05d}.png" for i, label in enumerate(labels)]


def write_image_folder(out: Path, files: list[str], coco: dict, image, *, unit: str) -> None:
    """Write image(i) (a PIL image) as out/files[i] (PNG) and `coco` as out/boxes.json. The boxes go to
    UNFINISHED_EXPORT first (an interrupted export is known as one, and replaced by the next), and to boxes.json,
    atomically, once every image is written."""
    from ..checkpoint import atomic_write

    boxes = json.dumps(coco, indent=1).encode()
    atomic_write(out / UNFINISHED_EXPORT, lambda f: f.write(boxes))
    for i, file in enumerate(tqdm(files, desc="export", unit=unit)):
        (out / file).parent.mkdir(exist_ok=True)
        image(i).save(out / file, format="PNG")
    atomic_write(out / BOXES_FILE, lambda f: f.write(boxes))
    (out / UNFINISHED_EXPORT).unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cait.data.export",
        description="Write the first N Fashion-MNIST scenes of a split as an ImageFolder (DIR/<class>/<index>.png, "
        "lossless) with their boxes in DIR/boxes.json (COCO format): real files to test the dataset features on "
        "(--data DIR --boxes DIR/boxes.json), and the scenes for use in other tools.",
    )
    parser.add_argument("dir", type=Path, help="output directory: new, empty, or a previous export (replaced)")
    parser.add_argument("--n", type=int, required=True, help="how many scenes: the split's first N")
    parser.add_argument("--split", choices=list(SPLIT_FILES), default="val", help="default: val")
    parser.add_argument("--style", choices=SCENE_STYLES, default="default", help="the scenes' look (default: default)")
    parser.add_argument("--seed", type=int, default=0, help="the scenes' layout seed (default: 0)")
    args = parser.parse_args(argv)
    export = lambda: export_scenes(args.dir, n=args.n, split=args.split, style=args.style, seed=args.seed)
    return run_export(export, args.dir, what="scenes")


def run_export(export: Callable[[], int], out: Path, *, what: str) -> int:
    """A command's exit code for export() into `out`: 0 and a line saying what was written, or 2 and an error line."""
    try:
        count = export()
    except InputError as e:  # bad arguments, a folder that is not an export, an output that cannot be written
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a folder removed mid-export: the next export into DIR replaces it
        from ..outputs import write_failure

        print(f"error: {write_failure(e)}", file=sys.stderr)
        return 2
    print(f"wrote {count} {what} under {out} and their boxes to {out / BOXES_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
