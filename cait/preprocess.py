"""What the model sees of an image (its evaluation view and transform), and class names for a model config."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable

import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset
from torchvision.transforms import v2 as T

from .config import CaiTConfig


@lru_cache(maxsize=1)
def imagenet_class_names() -> tuple[str, ...]:
    """ImageNet-1k class descriptions as shipped by timm (no network)."""
    from timm.data import ImageNetInfo

    info = ImageNetInfo()
    return tuple(info.index_to_description(i) for i in range(info.num_classes()))


def class_names(cfg: CaiTConfig) -> tuple[str, ...]:
    names = imagenet_class_names() if cfg.is_imagenet else tuple(cfg.labels)
    if len(names) != cfg.num_classes:  # e.g. a re-headed model: fall back to indices, never mislabel
        return tuple(f"class {i}" for i in range(cfg.num_classes))
    return names


def model_view(image: Image.Image, cfg: CaiTConfig) -> Image.Image:
    """The pixels the model sees, as an image: colour mode to in_chans, bicubic resize of the short side
    to img_size / crop_pct, centre crop img_size (CaiT uses crop_pct 1.0, so the crop keeps the central
    square). Figures draw heat maps on this view, so that a map and its pixels line up."""
    resize = math.floor(cfg.img_size / cfg.crop_pct)
    view = T.Compose(
        [T.Resize(resize, interpolation=T.InterpolationMode.BICUBIC, antialias=True), T.CenterCrop(cfg.img_size)]
    )
    return view(image.convert("RGB" if cfg.in_chans == 3 else "L"))


def view_tensor(view: Image.Image, cfg: CaiTConfig) -> torch.Tensor:
    """A `model_view` as the model's input: float tensor [C, H, W] normalised with the config's mean and std."""
    return T.Normalize(cfg.mean, cfg.std)(
        T.functional.to_dtype(T.functional.pil_to_tensor(view), torch.float32, scale=True)
    )


def eval_transform(cfg: CaiTConfig) -> Callable[[Image.Image], torch.Tensor]:
    """The variant's evaluation transform: `model_view`, then `view_tensor`."""
    return lambda image: view_tensor(model_view(image, cfg), cfg)


def to_batch(images: list[Image.Image], cfg: CaiTConfig) -> torch.Tensor:
    """PIL images -> normalised batch [B, C, H, W] ready for the model."""
    tf = eval_transform(cfg)
    return torch.stack([tf(im) for im in images])


class EvalImages(Dataset):
    """(normalised tensor, label, box in model-input pixels or NaNs) from a dataset of PIL images: what the model
    is scored on here and in `cait.train.calibration`."""

    def __init__(self, base: Dataset, model: nn.Module):
        self.base, self.tf = base, eval_transform(model.cfg)
        boxes = getattr(base, "boxes", None)
        self.boxes = None if boxes is None else model.cfg.box_to_input(torch.as_tensor(boxes), base.canvas)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        image, label = self.base[i]
        box = self.boxes[i] if self.boxes is not None else torch.full((4,), float("nan"))
        return self.tf(image), label, box
