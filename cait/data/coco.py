"""COCO boxes of a folder's images in the model's input pixels, and which boxes are left out of the scoring and
why: a box the model cannot see (cut off by the centre crop), a box that cannot be right (zero or negative size,
outside its image), a box of an image that cannot be read, or of a file the folder does not hold.

A box left out is a NaN row, so the pointing game and the mass in the box score only boxes the model sees
(the visible part of each); `BoxCount` says how many were left out for each reason."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image

from ..config import CaiTConfig
from .image_file import IMAGE_ERRORS, exif_orientation, upright_box
from .names import DataError, DataWarning

# why a box is left out, and how a line says it (after "N box(es) ...")
LEFT_OUT = {
    "out_of_view": "outside the model's view (the centre crop cuts them off)",
    "bad_size": "with zero or negative width or height",
    "outside_image": "outside their image",
    "unreadable": "of an image that cannot be read",
    "not_in_folder": "of a file the folder does not hold",
}


@dataclass
class BoxCount:
    """How many images have a box the model sees (`boxed`), and per `LEFT_OUT` reason how many boxes were left
    out (only the reasons that occurred)."""

    boxed: int = 0
    left_out: dict[str, int] = field(default_factory=dict)

    def line(self, *, decoded: bool = True) -> str:
        """One line for a log and a page: what is scored and what was left out and why. decoded: False for the
        reader's count, made from the files' headers: a file whose header reads but whose pixels do not decode
        (truncated) is known only at the pass, so the line promises no score, and the closing count says."""
        text = f"{self.boxed:,} image(s) with a box in the model's view are scored"
        if not decoded:
            text = (
                f"{self.boxed:,} image(s) with a box in the model's view by their headers, scored if their pixels "
                "decode (the closing line counts them)"
            )
        if self.left_out:
            reasons = ", ".join(f"{n:,} {LEFT_OUT[k]}" for k, n in self.left_out.items())
            text += f"; {sum(self.left_out.values()):,} box(es) left out: {reasons}"
        return text


def read_coco_boxes(
    file: str | Path, root: Path, paths: list[str], cfg: CaiTConfig, *, folder: list[str] | None = None
) -> tuple[torch.Tensor, BoxCount]:
    """Boxes [len(paths), 4] in model-input pixels from a COCO-format JSON file (NaN rows for images without a
    box the model sees), and their `BoxCount` (also warned as one `DataWarning` line when any was left out).

    An image entry's `file_name` matches a path relative to root, or any trailing part of it does (e.g.
    "val/cat/1.jpg" for "cat/1.jpg"), or else its base name when that is unique in the folder. Of several
    annotations of one image, the largest valid box (by area) is the image's box: the main object.

    Args:
        paths: the images read (relative to root). folder: every image of the folder (default `paths`): a box
            of a file in the folder but not read (a --limit subset) is not counted as left out.
    Raises DataError (one line) when the file is not a COCO boxes file or names none of the folder's images."""
    images, largest, bad = _read_coco(Path(file))
    folder = paths if folder is None else folder
    index = {p: i for i, p in enumerate(folder)}
    base_counts = Counter(p.rsplit("/", 1)[-1] for p in folder)
    by_base = {p.rsplit("/", 1)[-1]: i for i, p in enumerate(folder) if base_counts[p.rsplit("/", 1)[-1]] == 1}
    read = {p: j for j, p in enumerate(paths)}
    out, left, matched, unmatched = torch.full((len(paths), 4), float("nan")), Counter(), False, []
    for image_id, file_name, size in images:
        if image_id not in largest and not bad[image_id]:
            continue
        i = _match(file_name, index, by_base)
        if i is None:
            left["not_in_folder"] += 1
            unmatched.append(file_name)
            continue
        matched, j = True, read.get(folder[i])
        if j is None:
            continue
        left["bad_size"] += bad[image_id]
        if image_id in largest:
            box, reason = _box_in_view(largest[image_id], size, root / paths[j], cfg)
            if reason:
                left[reason] += 1
            else:
                out[j] = box
    if not matched:
        names = [name for _, name, _ in images[:3]]
        raise DataError(f"{file} boxes none of the {len(folder):,} images read from {root} (it names {_few(names)})")
    count = BoxCount(int((~out.isnan().any(-1)).sum()), {k: left[k] for k in LEFT_OUT if left[k]})
    if count.left_out:
        missing = _missing(Path(file), root, unmatched)
        warnings.warn(f"{Path(file).name}: {count.line(decoded=False)}{missing}", DataWarning, stacklevel=2)
    return out, count


def _box_in_view(
    box: list[float], size: tuple[int, int] | None, image: Path, cfg: CaiTConfig
) -> tuple[torch.Tensor | None, str | None]:
    """(the box in input pixels, None) or (None, the `LEFT_OUT` reason it is not scored). size: the image's
    (width, height) from the COCO file, else read from the file's header. The header is read either way: a box of
    an image that cannot be opened is left out whether or not the COCO file gives its size."""
    try:
        with Image.open(image) as opened:  # reads the header only
            box, size = _upright(box, size, opened.size, exif_orientation(opened))
    except IMAGE_ERRORS:
        return None, "unreadable"
    x0, y0, x1, y1 = box
    if x0 >= size[0] or y0 >= size[1] or x1 <= 0 or y1 <= 0:
        return None, "outside_image"
    seen = cfg.box_to_input(box, size)  # clipped to the crop: the visible part
    if seen[2] <= seen[0] or seen[3] <= seen[1]:
        return None, "out_of_view"
    return seen, None


def _upright(
    box: list[float], given: tuple[int, int] | None, stored: tuple[int, int], orientation: int | None
) -> tuple[list[float], tuple[int, int]]:
    """A COCO box and its image's size in the picture the model sees, which the decoder turns upright as the
    file's EXIF orientation says (a phone photo). The COCO format defines no orientation: we read its width and
    height as those of the file as stored and its boxes as indexing the stored pixels, the grid the file holds,
    and turn the box as the decoder turns the pixels. One exception, told by the numbers: a COCO file giving
    the upright size, width and height swapped from the stored ones, was made by a tool that showed the picture
    upright, and its boxes are drawn there already. given: the COCO file's (width, height), else None; stored:
    the file header's."""
    frame = given or stored
    if orientation in (5, 6, 7, 8) and given is not None and tuple(given) == stored[::-1] != stored:
        return list(box), tuple(given)
    return upright_box(box, frame, orientation)


def _missing(file: Path, root: Path, unmatched: list[str]) -> str:
    """What the warning adds when the boxes name files that are not on disk (an interrupted copy or export reads
    as complete otherwise), naming a few; files left out by a limit exist, and are not named."""
    missing = [
        n
        for n in unmatched
        if not any((root / "/".join(Path(n).parts[k:])).exists() for k in range(len(Path(n).parts)))
    ]
    if not missing:
        return ""
    return (
        f"; {file} boxes {len(missing):,} image(s) missing from {root} ({_few(missing, 3)}): an unfinished copy "
        "or export? Only the images on disk are used"
    )


def _few(names: list[str], n: int = 3) -> str:
    shown = ", ".join(repr(s) for s in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def _match(file_name: str, index: dict[str, int], by_base: dict[str, int]) -> int | None:
    parts = Path(file_name).as_posix().split("/")
    for k in range(len(parts)):
        if "/".join(parts[k:]) in index:
            return index["/".join(parts[k:])]
    return by_base.get(parts[-1])


CocoImage = tuple[object, str, "tuple[int, int] | None"]  # (id, file_name, (width, height) if given)


def _read_coco(file: Path) -> tuple[list[CocoImage], dict[object, list[float]], Counter]:
    """A COCO boxes file's images, per image id its largest box (x0, y0, x1, y1) in original pixels of
    positive width and height, and per image id how many boxes had zero or negative width or height;
    DataError (one line) for a file that is not one."""
    try:
        coco = json.loads(file.read_text())
    except OSError as e:
        raise DataError(f"cannot read boxes file {file}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{file} is not JSON ({e}); boxes need COCO format: images, annotations") from None
    try:
        images = [
            (
                e["id"],
                str(e["file_name"]),
                (int(e["width"]), int(e["height"])) if "width" in e and "height" in e else None,
            )
            for e in coco["images"]
        ]
        largest: dict[object, list[float]] = {}
        bad: Counter = Counter()
        for ann in coco["annotations"]:
            x, y, w, h = (float(v) for v in ann["bbox"])
            if not (w > 0 and h > 0):
                bad[ann["image_id"]] += 1
                continue
            best = largest.get(ann["image_id"])
            if best is None or w * h > (best[2] - best[0]) * (best[3] - best[1]):
                largest[ann["image_id"]] = [x, y, x + w, y + h]
    except (KeyError, TypeError, ValueError):
        raise DataError(
            f"{file} is not a COCO boxes file: it needs 'images' with 'id' and 'file_name' and 'annotations' "
            f"with 'image_id' and 'bbox' [x, y, w, h]"
        ) from None
    return images, largest, bad
