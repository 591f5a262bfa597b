"""What the datasets here share: the contract of a dataset with boxes, and the two generic datasets (images
with their boxes, an image folder).

Every dataset yields (PIL.Image, int label) and has `.classes`; transforms are the caller's business.
A dataset with boxes (`BoxedDataset`) also says where the object is, for localization scores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from .names import DataError


@runtime_checkable
class BoxedDataset(Protocol):
    """The contract of a dataset with boxes, read by `cait.evaluate` (localization of every explanation)
    and the analysis scripts: item i is (PIL image, int label) of a SQUARE image of side `canvas` pixels,
    and `boxes[i]` is its object's box (x0, y0, x1, y1) in those pixels. Square, so that the evaluation
    resize scales both axes alike: in the model's input the box is boxes[i] * img_size / canvas."""

    classes: Sequence[str]
    boxes: np.ndarray  # float [len, 4]
    canvas: int

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> tuple[Image.Image, int]: ...


class ImagesWithBoxes(Dataset):
    """Square images with labels and boxes (in the images' pixels), as a `BoxedDataset`."""

    def __init__(
        self, images: list[Image.Image], labels: list[int], boxes: np.ndarray, *, canvas: int, classes: Sequence[str]
    ):
        if not all(im.size == (canvas, canvas) for im in images):
            raise DataError(f"boxes need square images of side {canvas}")
        self.images, self.labels, self.canvas, self.classes = images, labels, canvas, classes
        self.boxes = np.asarray(boxes, dtype=np.float32).reshape(len(images), 4)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return self.images[i], self.labels[i]


class ImageFolderData(Dataset):
    """A user's directory: ROOT/{train,val}/<class name>/<image files>."""

    def __init__(self, root: str | Path, split: str, *, subset: int | None = None):
        from torchvision.datasets import ImageFolder

        from .image_file import read_image

        path = Path(root) / split
        if not path.is_dir():
            raise DataError(
                f"{path} does not exist; an image folder needs {Path(root)}/train/<class>/ and "
                f"{Path(root)}/val/<class>/ with images"
            )
        try:
            self.folder = ImageFolder(str(path), loader=read_image)  # the one decoder, as every reader
        except (FileNotFoundError, RuntimeError) as e:
            raise DataError(f"{path} holds no usable images: {e}") from None
        self.classes = tuple(self.folder.classes)
        self.n = len(self.folder) if subset is None else min(subset, len(self.folder))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return self.folder[i]
