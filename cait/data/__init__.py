"""Datasets: real Fashion-MNIST (Debian's files), Fashion-MNIST scenes (with boxes), any ImageFolder
directory, and the shipped example images. `build_dataset` picks one by name (PIL images, for training);
`read_images` reads any of them, or a folder with COCO boxes, as the model sees it (for runs over a dataset);
`read_from_flags` reads what `cait.flags.add_data_flags`' flags ask for;
`split_name` is how every page, figure and log names a split of the built-in data."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..lazy import lazy_attributes
from .examples import EXAMPLES_DIR, ExampleImage, read_examples
from .names import NATIVE_INPUT, SCENE_SIDE, SCENE_STYLES, SPLIT_FILES, DataError, DataWarning, data_name, split_name

if TYPE_CHECKING:
    from torch.utils.data import Dataset

# The datasets import torch: each is loaded on first use, so that a data command's --help and a flag's check
# (which need only the names above) run without importing it.
_LAZY = {
    "BoxedDataset": "base",
    "ImageFolderData": "base",
    "ImagesWithBoxes": "base",
    "FashionMNIST": "fashion_mnist",
    "load_fashion_mnist": "fashion_mnist",
    "ImageSet": "reader",
    "read_images": "reader",
    "read_from_flags": "reader",
    "FashionMNISTScenes": "scenes",
}
__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "NATIVE_INPUT",
    "SCENE_SIDE",
    "SCENE_STYLES",
    "EXAMPLES_DIR",
    "BoxedDataset",
    "DataError",
    "DataWarning",
    "ExampleImage",
    "FashionMNIST",
    "FashionMNISTScenes",
    "ImageFolderData",
    "ImageSet",
    "ImagesWithBoxes",
    "build_dataset",
    "data_name",
    "load_fashion_mnist",
    "read_examples",
    "read_images",
    "read_from_flags",
    "split_name",
]


def build_dataset(
    data: str,
    split: str,
    *,
    seed: int = 0,
    subset: int | None = None,
    cache: bool = False,
    style: str = "default",
    pixel_noise: float | None = None,
) -> Dataset:
    """data: "fashion-mnist", "fashion-mnist-scenes" or an ImageFolder root; split: "train" or "val".
    cache: read scenes from the disk cache (rendering it first if needed) instead of rendering each.
    style, pixel_noise: the scenes' look (`FashionMNISTScenes`); other data refuses anything but the default."""
    from .base import ImageFolderData
    from .fashion_mnist import FashionMNIST
    from .scenes import FashionMNISTScenes

    if split not in SPLIT_FILES:
        raise DataError(f"split must be 'train' or 'val', got {split!r}")
    if subset is not None and subset <= 0:
        raise DataError(f"--subset must be positive, got {subset}")
    if data == "fashion-mnist-scenes":
        return FashionMNISTScenes(split, seed=seed, subset=subset, cache=cache, style=style, pixel_noise=pixel_noise)
    if style != "default" or pixel_noise is not None:
        raise DataError(f"a scene style and pixel noise apply to fashion-mnist-scenes only, not {data}")
    if data == "fashion-mnist":
        return FashionMNIST(split, subset=subset)
    if not Path(data).exists():
        raise DataError(f"unknown dataset '{data}': use fashion-mnist, fashion-mnist-scenes or an existing directory")
    return ImageFolderData(data, split, subset=subset)
