"""Datasets: real Fashion-MNIST (Debian's files), Fashion-MNIST scenes (with boxes), any ImageFolder
directory, and the shipped example images. `build_dataset` picks one by name."""

from __future__ import annotations

from pathlib import Path

from torch.utils.data import Dataset

from .base import NATIVE_INPUT, SPLIT_FILES, BoxedDataset, DataError, ImageFolderData, ImagesWithBoxes
from .examples import EXAMPLES_DIR, ExampleImage, read_examples
from .fashion_mnist import FashionMNIST, load_fashion_mnist
from .scenes import SCENE_SIDE, FashionMNISTScenes

__all__ = [
    "NATIVE_INPUT",
    "SCENE_SIDE",
    "EXAMPLES_DIR",
    "BoxedDataset",
    "DataError",
    "ExampleImage",
    "FashionMNIST",
    "FashionMNISTScenes",
    "ImageFolderData",
    "ImagesWithBoxes",
    "build_dataset",
    "load_fashion_mnist",
    "read_examples",
]


def build_dataset(data: str, split: str, *, seed: int = 0, subset: int | None = None, cache: bool = False) -> Dataset:
    """data: "fashion-mnist", "fashion-mnist-scenes" or an ImageFolder root; split: "train" or "val".
    cache: read scenes from the disk cache (rendering it first if needed) instead of rendering each."""
    if split not in SPLIT_FILES:
        raise DataError(f"split must be 'train' or 'val', got {split!r}")
    if subset is not None and subset <= 0:
        raise DataError(f"--subset must be positive, got {subset}")
    if data == "fashion-mnist":
        return FashionMNIST(split, subset=subset)
    if data == "fashion-mnist-scenes":
        return FashionMNISTScenes(split, seed=seed, subset=subset, cache=cache)
    if not Path(data).exists():
        raise DataError(f"unknown dataset '{data}': use fashion-mnist, fashion-mnist-scenes or an existing directory")
    return ImageFolderData(data, split, subset=subset)
