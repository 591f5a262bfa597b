"""What the model sees of an image (its evaluation view and transform), and class names for a model config."""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import numpy as np
import torch
from PIL import Image

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
    square); timm's evaluation transform, pixel for pixel (tested). Figures draw heat maps on this view, so
    that a map and its pixels line up. Written with PIL, which torchvision calls for PIL images anyway:
    importing torchvision costs the app's start about a second (it pulls in torch._dynamo)."""
    image = image.convert(cfg.image_mode)
    size, (left, top) = cfg.view_geometry(*image.size)
    view = image.resize(size, Image.Resampling.BICUBIC)
    return view.crop((left, top, left + cfg.img_size, top + cfg.img_size))


def view_pixels(view: Image.Image) -> torch.Tensor:
    """A `model_view` as float [C, H, W] in [0, 1], before normalisation (where `cait.corruptions` apply)."""
    pixels = torch.from_numpy(np.array(view, dtype=np.uint8, copy=True))
    return (pixels[:, :, None] if pixels.ndim == 2 else pixels).permute(2, 0, 1).float() / 255


def normalise(pixels: torch.Tensor, cfg: CaiTConfig) -> torch.Tensor:
    """Pixels [..., C, H, W] in [0, 1] as the model's input: minus the config's mean, over its std, per channel."""
    mean, std = (torch.tensor(v, dtype=pixels.dtype, device=pixels.device).view(-1, 1, 1) for v in (cfg.mean, cfg.std))
    return (pixels - mean) / std


def view_tensor(view: Image.Image, cfg: CaiTConfig) -> torch.Tensor:
    """A `model_view` as the model's input: float tensor [C, H, W] normalised with the config's mean and std."""
    return normalise(view_pixels(view), cfg)


def eval_transform(cfg: CaiTConfig) -> Callable[[Image.Image], torch.Tensor]:
    """The variant's evaluation transform: `model_view`, then `view_tensor`."""
    return lambda image: view_tensor(model_view(image, cfg), cfg)


def to_batch(images: list[Image.Image], cfg: CaiTConfig) -> torch.Tensor:
    """PIL images -> normalised batch [B, C, H, W] ready for the model."""
    tf = eval_transform(cfg)
    return torch.stack([tf(im) for im in images])
