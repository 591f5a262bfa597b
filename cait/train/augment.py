"""The DeiT training augmentation on batched uint8 tensors: no PIL, no per-image decoding.

`BatchAugment` turns a uint8 [B, H, W, C] batch (e.g. rows of a `.pixels` array) into the model's
normalised float [B, in_chans, img_size, img_size] input. It does what `cait.train`'s PIL pipeline does:

- random resized crop (area in --crop-scale..1, aspect 3/4..4/3, torchvision's parameter draw; bicubic,
  antialiased, on uint8 as PIL does), then horizontal flip with probability --hflip;
- colour jitter (--color-jitter: brightness, contrast, saturation factors in [1 - j, 1 + j]; a fixed order,
  where torchvision shuffles it) when RandAugment is off, as timm does;
- RandAugment-lite (--randaug "rand-mM[-nN]..."): torchvision's RandAugment with N ops at magnitude M of
  10, per image, before the crop. It approximates timm's: the op set differs slightly and the magnitude
  noise (mstd) is not drawn;
- the model's channels (grey <-> RGB as PIL's convert does), normalisation, then timm's RandomErasing
  (--reprob, per-pixel noise).

Image k's draws come from the global torch (and python, for erasing) RNG seeded with seeds[k] inside a
`fork_rng`, so an image's augmentation depends only on its seed: not on its batch, worker or rank.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torchvision.transforms import RandomResizedCrop
from torchvision.transforms import v2 as T
from torchvision.transforms.v2 import functional as TF

from ..errors import InputError

CROP_RATIO = (3 / 4, 4 / 3)  # aspect-ratio range of the random resized crop (timm/torchvision default)


def parse_randaug(spec: str | None) -> tuple[int, int] | None:
    """(ops per image, magnitude 0-10) of a timm RandAugment string like "rand-m9-mstd0.5-inc1", or None
    for "none"; ValueError for anything else."""
    if spec in (None, "", "none"):
        return None
    fields = {}
    for part in spec.split("-")[1:]:
        match = re.fullmatch(r"([a-z]+)(\d+(?:\.\d+)?)", part)
        if match:
            fields[match[1]] = float(match[2])
    if not spec.startswith("rand-") or "m" not in fields:
        raise InputError(f"--randaug {spec!r} is not a timm RandAugment string like 'rand-m9-mstd0.5-inc1' (or 'none')")
    if not 0 <= fields["m"] <= 10:
        raise InputError(f"--randaug magnitude must be in 0..10, got {fields['m']:g}")
    return int(fields.get("n", 2)), round(fields["m"])


@dataclass
class BatchAugment:
    img_size: int  # output side (the model's input)
    in_chans: int  # output channels (the model's)
    mean: tuple[float, ...]  # normalisation of the output, per output channel
    std: tuple[float, ...]
    crop_scale: tuple[float, float] = (0.25, 1.0)  # area range of the random resized crop
    hflip: float = 0.5  # horizontal flip probability
    color_jitter: float = 0.0  # brightness/contrast/saturation strength; ignored with RandAugment
    randaug: str | None = None  # timm RandAugment string (run as RandAugment-lite) or None
    reprob: float = 0.0  # random erasing probability
    _randaug: T.RandAugment | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        parsed = parse_randaug(self.randaug)
        if parsed is not None:
            ops, magnitude = parsed
            # magnitude M of timm's 0..10 scale = bin M of 11; geometric ops fill with the mean, as timm's
            fill = [round(255 * m) for m in (tuple(self.mean) * 3)[:3]]
            self._randaug = T.RandAugment(num_ops=ops, magnitude=magnitude, num_magnitude_bins=11, fill=fill)

    def __call__(self, images: torch.Tensor, seeds: Sequence[int]) -> torch.Tensor:
        """uint8 [B, H, W, C] (C = 1 or 3) -> normalised float [B, in_chans, img_size, img_size]."""
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[-1] not in (1, 3):
            raise ValueError(f"expected uint8 [B, H, W, 1 or 3] images, got {images.dtype} {tuple(images.shape)}")
        x = images.permute(0, 3, 1, 2).expand(-1, 3, -1, -1)  # augmented in RGB, as the PIL path does
        with torch.random.fork_rng(devices=[]):
            x, jitter, erase_seeds = self._per_image(x, seeds)
        x = x.float().div_(255)
        if self.color_jitter and self._randaug is None:
            x = _jitter(x, jitter)
        x = TF.normalize(to_channels(x, self.in_chans), list(self.mean), list(self.std))
        if self.reprob:
            self._erase(x, erase_seeds)
        return x

    def _per_image(self, x: torch.Tensor, seeds: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Each image under its own seed: RandAugment, random resized crop (bicubic, antialiased, on
        uint8 like PIL), flip; and the draws of the batched steps: jitter factors, the erasing seed."""
        j, bicubic = self.color_jitter, T.InterpolationMode.BICUBIC
        out, jitter, erase_seeds = [], [], []
        for image, seed in zip(x, seeds, strict=True):
            torch.default_generator.manual_seed(seed)  # (torch.manual_seed also seeds every accelerator: 200x slower)
            if self._randaug is not None:
                image = self._randaug(image)
            top, left, h, w = RandomResizedCrop.get_params(image, list(self.crop_scale), list(CROP_RATIO))
            image = TF.resized_crop(image, top, left, h, w, [self.img_size] * 2, interpolation=bicubic, antialias=True)
            out.append(TF.horizontal_flip(image) if torch.rand(()) < self.hflip else image)
            jitter.append(torch.empty(3).uniform_(max(0.0, 1 - j), 1 + j))
            erase_seeds.append(int(torch.randint(0, 2**62, ())))
        return torch.stack(out), torch.stack(jitter), erase_seeds

    def _erase(self, x: torch.Tensor, seeds: list[int]) -> None:
        from timm.data.random_erasing import RandomErasing

        erase = RandomErasing(self.reprob, mode="pixel", device=x.device)
        state = random.getstate()
        with torch.random.fork_rng(devices=[]):
            for image, seed in zip(x, seeds):
                torch.default_generator.manual_seed(seed)
                random.seed(seed)
                erase(image)
        random.setstate(state)


def _jitter(x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """torchvision's adjust_brightness / adjust_contrast / adjust_saturation on an RGB batch in [0, 1],
    with one factor of each per image."""
    brightness, contrast, saturation = factors.to(x.device).T.reshape(3, -1, 1, 1, 1)
    x = (x * brightness).clamp_(0, 1)
    x = (x * contrast + TF.rgb_to_grayscale(x).mean((1, 2, 3), keepdim=True) * (1 - contrast)).clamp_(0, 1)
    return (x * saturation + TF.rgb_to_grayscale(x) * (1 - saturation)).clamp_(0, 1)


def to_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    """RGB -> the model's channels: unchanged, or grey with PIL's convert("L") weights."""
    if channels not in (1, 3):
        raise InputError(f"models with {channels} input channels are not supported (1 or 3)")
    return TF.rgb_to_grayscale(x) if channels == 1 else x
