"""Real Fashion-MNIST, read from Debian's `dataset-fashion-mnist` files."""

from __future__ import annotations

import gzip
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from ..config import FASHION_MNIST_CLASSES
from .names import SPLIT_FILES, DataError, split_name

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
INSTALL_HINT = "install them with: sudo apt-get install dataset-fashion-mnist"


def _read_idx(path: Path, magic: int) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"Fashion-MNIST file {path} not found; {INSTALL_HINT}")
    with gzip.open(path, "rb") as f:
        raw = f.read()
    header = np.frombuffer(raw[:4], ">u4")[0]
    if header != magic:
        raise DataError(f"{path} is not an idx file (magic {header}, expected {magic})")
    ndim = magic & 0xFF
    shape = tuple(int(n) for n in np.frombuffer(raw[4 : 4 + 4 * ndim], ">u4"))
    return np.frombuffer(raw[4 + 4 * ndim :], np.uint8).reshape(shape)


@lru_cache(maxsize=2)
def load_fashion_mnist(split: str, root: Path = FASHION_MNIST_DIR) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [n, 28, 28], labels int64 [n]) of the 'train' (60k) or 'val' (10k test) split."""
    prefix = SPLIT_FILES[split]
    images = _read_idx(root / f"{prefix}-images-idx3-ubyte.gz", 2051)
    labels = _read_idx(root / f"{prefix}-labels-idx1-ubyte.gz", 2049).astype(np.int64)
    return images, labels


class FashionMNIST(Dataset):
    """Real Fashion-MNIST: grey 28x28 garments."""

    classes = FASHION_MNIST_CLASSES

    def __init__(self, split: str, *, subset: int | None = None):
        self.split = split
        self.images, self.labels = load_fashion_mnist(split)
        self.n = len(self.labels) if subset is None else min(subset, len(self.labels))

    @property
    def name(self) -> str:
        """The split as every page and log names it (`cait.data.names.split_name`)."""
        return split_name("fashion-mnist", self.split)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return Image.fromarray(self.images[i], mode="L"), int(self.labels[i])

    @property
    def pixels(self) -> np.ndarray:
        """uint8 [n, 28, 28, 1]: a view, no copy."""
        return self.images[: self.n, :, :, None]
