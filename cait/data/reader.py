"""One reader for every image set a model is run over: the scenes, Fashion-MNIST, or a user's directory (an
ImageFolder of class folders, or a flat folder of unlabelled images), with optional COCO boxes.

`read_images` returns an `ImageSet`: item i is (x as the model sees it, label, box in model-input pixels, i,
ok). An unreadable image gives ok=False instead of an exception, so a run over thousands of files skips and
names the bad ones instead of dying on them. Class folders map to the model's classes: ImageNet synsets
(`n01440764`) through timm's ImageNet info for an ImageNet model, otherwise by class name (`class_key`).
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ..config import CaiTConfig
from ..flags import SAMPLES
from .coco import BoxCount, read_coco_boxes
from .image_file import IMAGE_ERRORS, read_image, unreadable_reason
from .names import SPLIT_FILES, UNFINISHED_EXPORT, DataError, DataWarning, split_name

BUILT_IN = ("fashion-mnist-scenes", "fashion-mnist")
SYNSET = re.compile(r"n\d{8}")
SAMPLE_SEED = 0  # the seed of a stratified subset: the same N images every run


class ImageSet(Dataset):
    """Images as the model sees them, with labels and boxes in the model's terms.

    name: one line for figures and summaries. paths: per image, its file relative to the root (or
    "<dataset>/<split>/<index>" for built-in data). labels: long [N], the model's class index (-1 unknown), or
    None for unlabelled data. boxes: float [N, 4] (x0, y0, x1, y1) in model-input pixels, NaN rows for images
    without a box the model sees, or None when there are none; box_count: how many boxes are scored and why the
    others were left out (`cait.data.coco.BoxCount`). classes: the model's class names.
    Item i: (x [C, H, W], label, box [4], i, ok); the default DataLoader collate batches it as is."""

    def __init__(
        self,
        *,
        name: str,
        paths: list[str],
        load: Callable[[int], Image.Image],
        cfg: CaiTConfig,
        labels: torch.Tensor | None,
        boxes: torch.Tensor | None,
        box_count: BoxCount | None = None,
        normalise: bool = True,
    ):
        from ..preprocess import class_names

        self.name, self.paths, self.labels, self.boxes = name, paths, labels, boxes
        if box_count is None and boxes is not None:
            box_count = BoxCount(int((~boxes.isnan().any(-1)).sum()))
        self.box_count = box_count
        self.classes = class_names(cfg)
        self.cfg, self.normalise, self._load = cfg, normalise, load

    def __len__(self) -> int:
        return len(self.paths)

    def image(self, i: int) -> Image.Image:
        """Image i as read, before the model's view: what a viewer shows of it (e.g. an atlas's exemplar).
        Raises PIL's errors (`IMAGE_ERRORS`) for a file that cannot be read."""
        return self._load(i)

    def skip_reason(self, i: int) -> str | None:
        """Why image i is skipped, in a few words (None: it reads): what a skipped list says of each file."""
        try:
            self._load(i)
        except IMAGE_ERRORS as e:
            return unreadable_reason(e)
        return None

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, torch.Tensor, int, bool]:
        from ..preprocess import model_view, normalise, view_pixels

        label = -1 if self.labels is None else int(self.labels[i])
        box = torch.full((4,), float("nan")) if self.boxes is None else self.boxes[i]
        try:
            x, ok = view_pixels(model_view(self._load(i), self.cfg)), True
        except IMAGE_ERRORS:
            x, ok = torch.zeros(self.cfg.in_chans, self.cfg.img_size, self.cfg.img_size), False
        return (normalise(x, self.cfg) if self.normalise and ok else x), label, box, i, ok


def read_from_flags(args, cfg: CaiTConfig, *, limit: int | None = None, **options) -> ImageSet:
    """The images `cait.flags.add_data_flags`' flags ask for (--data, and --boxes, --limit, --sample where the
    command declares them), through `read_images`; the one reader of every command's image set.

    Args:
        args: the parsed flags (an `argparse.Namespace`, or options holding the same names).
        cfg: the model's config (its input size and classes).
        limit: the count when --limit is not given (or the command has none).
        options: more of `read_images`' keywords (normalise, scene_seed, ...).

    Returns:
        The `ImageSet`; raises DataError (one line) for data that cannot be read."""
    given = getattr(args, "limit", None)
    return read_images(
        args.data,
        cfg,
        boxes=getattr(args, "boxes", None),
        limit=limit if given is None else given,
        sample=getattr(args, "sample", "stratified"),
        **options,
    )


def read_images(
    data: str,
    cfg: CaiTConfig,
    *,
    split: str = "val",
    boxes: str | Path | None = None,
    limit: int | None = None,
    sample: str = "stratified",
    normalise: bool = True,
    scene_seed: int = 0,
    scene_style: str = "default",
    pixel_noise: float | None = None,
) -> ImageSet:
    """The images of `data` for a model of config `cfg`: "fashion-mnist-scenes" (labels and boxes; the scenes'
    seed, style and noise, read from the disk cache), "fashion-mnist", or a directory (DIR/<split>/ when that
    holds images, else DIR): class folders, or a flat folder of images (labels None). boxes: a COCO JSON file
    for a directory. limit: N images; of a directory, `sample` "stratified" takes a seeded share of each class
    folder (of a flat folder a seeded random N; `limit_subset`), "first" the first N in folder order; of the
    built-in data the first N (their order already mixes the classes). normalise=False: pixels in [0, 1] (for
    `cait.corruptions`). Raises DataError (one line) for data that cannot be read at all."""
    if limit is not None and limit <= 0:
        raise DataError(f"--limit must be positive, got {limit}")
    if sample not in SAMPLES:
        raise DataError(f"sample must be one of {', '.join(SAMPLES)}, got {sample!r}")
    if data in BUILT_IN:
        if boxes is not None:
            raise DataError(f"--boxes applies to a directory of images, not to {data}")
        return _built_in(data, cfg, split, limit, normalise, scene_seed, scene_style, pixel_noise)
    if scene_seed != 0 or scene_style != "default" or pixel_noise is not None:
        raise DataError(f"a scene seed, style and pixel noise apply to fashion-mnist-scenes only, not {data}")
    root = Path(data)
    if not root.is_dir():
        raise DataError(f"unknown data '{data}': use {', '.join(BUILT_IN)} or an existing directory of images")
    return _folder(root, cfg, split, boxes, limit, normalise, sample=sample)


def _built_in(
    data: str,
    cfg: CaiTConfig,
    split: str,
    limit: int | None,
    normalise: bool,
    seed: int,
    style: str,
    pixel_noise: float | None,
) -> ImageSet:
    from . import build_dataset

    if split not in SPLIT_FILES:
        raise DataError(f"split must be one of {', '.join(SPLIT_FILES)}, got {split!r}")
    source = build_dataset(data, split, seed=seed, subset=limit, cache=True, style=style, pixel_noise=pixel_noise)
    scenes = data == "fashion-mnist-scenes"
    look = f", seed {seed}, style {style}" + ("" if pixel_noise is None else f", pixel noise {pixel_noise:g}")
    name = f"{split_name(data, split)}: {len(source):,} {'scenes' if scenes else 'images'}{look if scenes else ''}"
    paths = [f"{data}/{split}/{i:06d}" for i in range(len(source))]
    return dataset_images(source, cfg, name=name, paths=paths, normalise=normalise)


def dataset_images(
    source: Dataset, cfg: CaiTConfig, *, name: str, paths: list[str] | None = None, normalise: bool = True
) -> ImageSet:
    """A dataset of (PIL image, label) items (`cait.data.build_dataset`'s, `ImagesWithBoxes`) as an ImageSet:
    its labels (`.labels`, an ImageFolder's targets, else read item by item) and, for a `BoxedDataset`, its
    boxes in model-input pixels. paths: a name per image (default "<index>")."""
    n = len(source)
    if hasattr(source, "labels"):
        labels = list(source.labels[:n])
    elif hasattr(getattr(source, "folder", None), "targets"):
        labels = list(source.folder.targets[:n])
    else:
        labels = [source[i][1] for i in range(n)]
    boxes = getattr(source, "boxes", None)
    return ImageSet(
        name=name,
        paths=paths or [f"{i:06d}" for i in range(n)],
        load=_ItemImage(source),
        cfg=cfg,
        labels=torch.as_tensor(labels, dtype=torch.long).reshape(n),
        boxes=None if boxes is None else cfg.box_to_input(torch.as_tensor(boxes[:n]), source.canvas),
        normalise=normalise,
    )


class _ItemImage:
    """Loads image i of a dataset of (PIL image, label) items (a class, not a lambda: DataLoader workers pickle it)."""

    def __init__(self, source: Dataset):
        self.source = source

    def __call__(self, i: int) -> Image.Image:
        return self.source[i][0]


class _FileImage:
    """Loads file i under a root in `mode` (the model's channels) by the one decoder (`read_image`), decoded in
    full here so that a truncated file fails now, not later."""

    def __init__(self, root: Path, paths: list[str], mode: str):
        self.root, self.paths, self.mode = root, paths, mode

    def __call__(self, i: int) -> Image.Image:
        return read_image(self.root / self.paths[i], mode=self.mode)


def image_extensions() -> frozenset[str]:
    """The file suffixes PIL can open (lower case, with the dot): what counts as an image in a directory."""
    Image.init()
    return frozenset(ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN)


def find_images(root: Path) -> list[str]:
    """Image files under root, recursively, as POSIX paths relative to it, in sorted order (folder by folder);
    hidden files and folders (".name") are left out."""
    exts = image_extensions()
    found = [
        p.relative_to(root)
        for p in root.rglob("*")
        if p.suffix.lower() in exts
        and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    ]
    return [p.as_posix() for p in sorted(found, key=lambda p: p.parts)]


def class_key(name: str) -> str:
    """What a folder name and a class name are compared by: case-insensitive, and runs of spaces, underscores
    and slashes count as one space ("T-shirt/top", "t-shirt_top" and "T-Shirt top" are one class)."""
    return re.sub(r"[\s_/]+", " ", name).strip().casefold()


def folder_name(class_name: str) -> str:
    """A class name as a folder name (a slash cannot be in one): what `cait.data.export` writes and
    `class_key` reads back as the same class."""
    return class_name.replace("/", "_")


def folder_classes(folders: list[str], cfg: CaiTConfig) -> dict[str, int]:
    """The model's class index of each class folder that maps to one: an ImageNet synset for an ImageNet
    model (timm's ImageNet info), else a folder named as a class (`class_key`; a name two classes share maps
    to neither). Folders that map to no class are left out."""
    from ..preprocess import class_names

    mapping: dict[str, int] = {}
    if cfg.is_imagenet:
        from timm.data import ImageNetInfo

        synsets = {s: i for i, s in enumerate(ImageNetInfo().label_names())}
        mapping.update({f: synsets[f] for f in folders if SYNSET.fullmatch(f) and f in synsets})
    keys = [class_key(c) for c in class_names(cfg)]
    counts = Counter(keys)
    by_key = {k: i for i, k in enumerate(keys) if counts[k] == 1}
    mapping.update({f: by_key[class_key(f)] for f in folders if f not in mapping and class_key(f) in by_key})
    return mapping


def _image_files(root: Path, split: str) -> tuple[Path, list[str]]:
    """The folder to read and its images: DIR/<split> when it is a folder holding images (the train/val layout
    of `cait.train`), else DIR."""
    if (root / split).is_dir():
        paths = find_images(root / split)
        if paths:
            return root / split, paths
    return root, find_images(root)


def _folder(
    root: Path,
    cfg: CaiTConfig,
    split: str,
    boxes: str | Path | None,
    limit: int | None,
    normalise: bool,
    *,
    sample: str,
) -> ImageSet:
    """The folder's images: all, or `limit` of them, the first or (`sample` "stratified") `limit_subset`'s."""
    root, paths = _image_files(root, split)
    if (root / UNFINISHED_EXPORT).exists():
        warnings.warn(f"{root} holds an unfinished export (cait.data.export was stopped): rerun it", DataWarning)
    if not paths:
        raise DataError(f"{root} holds no images (looked for {', '.join(sorted(image_extensions())[:6])}, ...)")
    loose = [p for p in paths if "/" not in p]
    labelled = len(loose) < len(paths)
    if labelled and loose:
        warnings.warn(f"{len(loose)} image(s) directly in {root} are outside any class folder: left out", DataWarning)
        paths = [p for p in paths if "/" in p]
    folder = paths
    # classes are mapped over every folder, so that a limit cannot make a good folder look unmapped
    labels = _labels(root, paths, cfg) if labelled else None
    keep = list(range(min(len(paths), limit or len(paths))))
    if limit is not None and sample == "stratified":
        keep = limit_subset([p.split("/")[0] if labelled else "" for p in paths], limit)
    paths = [paths[i] for i in keep]
    labels = None if labels is None else labels[keep]
    box_tensor, box_count = (None, None) if boxes is None else read_coco_boxes(boxes, root, paths, cfg, folder=folder)
    count = f"{len(paths):,} images, " + (
        f"{len({p.split('/')[0] for p in paths})} classes" if labelled else "no labels"
    )
    name = (
        f"{'ImageFolder' if labelled else 'image folder'} {root}/ ({count}"
        + ("" if boxes is None else f"; boxes: {Path(boxes).name}")
        + ")"
    )
    return ImageSet(
        name=name,
        paths=paths,
        load=_FileImage(root, paths, cfg.image_mode),
        cfg=cfg,
        labels=labels,
        boxes=box_tensor,
        box_count=box_count,
        normalise=normalise,
    )


def limit_subset(groups: list[str], limit: int, seed: int = SAMPLE_SEED) -> list[int]:
    """Indices (ascending) of `limit` of the items, stratified by `groups` (each item's class folder): each
    group gets its share of `limit` (largest remainders round, ties to the earlier group), its items drawn by
    a permutation seeded by `seed`. A limit of at least the item count keeps every item."""
    if limit >= len(groups):
        return list(range(len(groups)))
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    exact = {g: limit * len(m) / len(groups) for g, m in members.items()}
    quota = {g: int(v) for g, v in exact.items()}
    by_remainder = sorted(members, key=lambda g: -(exact[g] - quota[g]))  # stable: ties keep folder order
    for g in by_remainder[: limit - sum(quota.values())]:
        quota[g] += 1
    rng = np.random.default_rng(seed)
    keep = [i for g, m in members.items() for i in np.asarray(m)[rng.permutation(len(m))[: quota[g]]].tolist()]
    return sorted(keep)


def _labels(root: Path, paths: list[str], cfg: CaiTConfig) -> torch.Tensor:
    """The model's class index per image from its class folder (-1: a folder that maps to no class)."""
    from ..preprocess import class_names

    folders = sorted({p.split("/")[0] for p in paths})
    mapping = folder_classes(folders, cfg)
    unmapped = [f for f in folders if f not in mapping]
    if len(unmapped) == len(folders):
        classes = class_names(cfg)
        raise DataError(
            f"none of the class folders of {root} ({_few(folders)}) names a class of the model "
            f"({_few(classes)}{', or ImageNet synsets like n01440764' if cfg.is_imagenet else ''})"
        )
    if unmapped:
        warnings.warn(
            f"{len(unmapped)} class folder(s) of {root} name no class of the model, their images are unlabelled: "
            f"{_few(unmapped)}",
            DataWarning,
        )
    return torch.tensor([mapping.get(p.split("/")[0], -1) for p in paths], dtype=torch.long)


def _few(names: list[str] | tuple[str, ...], n: int = 4) -> str:
    shown = ", ".join(repr(s) for s in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")
