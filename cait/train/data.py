"""The images of a training run: augmented a batch at a time on uint8 tensors (`cait.train.augment`) where the
dataset has a pixel array, through timm's PIL transforms otherwise; sample i of epoch e augmented from
(seed, e, i) alone, the epoch's order from (seed, e), so any worker, rank or resume sees the same images."""

from __future__ import annotations

import argparse
import signal
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..data import DataError, build_dataset
from ..preprocess import eval_transform
from .args import ModelConfig
from .augment import BatchAugment
from .seeding import derive_seed, seed_everything, seeded

INSIGHT_BATCH = 64  # fixed validation images on which residual ratios and class-attention entropy are measured


def train_transform(cfg: ModelConfig, args: argparse.Namespace):
    """timm's DeiT training transform (random resized crop, flip, RandAugment, random erasing) at the
    model's resolution. Augmentation runs on RGB (RandAugment's ops expect it); the image is then put in
    the model's colour mode before normalising with the config's mean/std."""
    from timm.data import create_transform
    from timm.data.random_erasing import RandomErasing
    from torchvision.transforms import v2 as T

    rgb_mean, rgb_std = (tuple(v) * (3 // len(v)) for v in (cfg.mean, cfg.std))  # RandAugment fills with the mean
    primary, secondary, _ = create_transform(
        cfg.img_size,
        is_training=True,
        scale=(args.crop_scale, 1.0),
        hflip=args.hflip,
        auto_augment=None if args.randaug == "none" else args.randaug,
        interpolation="bicubic",
        color_jitter=args.color_jitter or None,
        mean=rgb_mean,
        std=rgb_std,
        separate=True,
    )
    mode = cfg.image_mode
    final = T.Compose(
        [
            T.PILToTensor(),
            T.ToDtype(torch.float32, scale=True),
            T.Normalize(cfg.mean, cfg.std),
            RandomErasing(args.reprob, mode="pixel", device="cpu"),
        ]
    )
    pil = T.Compose([*primary.transforms, *secondary.transforms])
    return lambda image: final(pil(image.convert("RGB")).convert(mode))


class Transformed(Dataset):
    """(PIL image, label) dataset -> (tensor, label). With a seed, sample i of epoch e is augmented under
    RNGs seeded from (seed, e, i): the same in any worker, any rank, and after any resume."""

    def __init__(self, data: Dataset, transform, seed: int | None = None):
        self.data, self.transform, self.seed, self.epoch = data, transform, seed, 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, label = self.data[i]
        if self.seed is None:
            return self.transform(image), label
        seed = derive_seed(self.seed, self.epoch, i)
        if torch.utils.data.get_worker_info() is not None:  # a worker's RNGs serve nothing else: no restore
            seed_everything(seed)
            return self.transform(image), label
        with seeded(seed):
            return self.transform(image), label


class AugmentedPixels(Dataset):
    """A dataset's uint8 `.pixels` array -> (tensor, label), augmented a batch at a time on tensors (the
    DataLoader fetches a batch through __getitems__). As with Transformed, sample i of epoch e is a
    function of (seed, e, i) alone."""

    def __init__(self, data: Dataset, augment: BatchAugment, seed: int):
        self.pixels, self.labels = data.pixels, data.labels
        self.augment, self.seed, self.epoch = augment, seed, 0

    def __len__(self) -> int:
        return len(self.pixels)

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        images = torch.from_numpy(self.pixels[np.asarray(indices)])  # (fancy indexing copies: writable)
        x = self.augment(images, [derive_seed(self.seed, self.epoch, i) for i in indices])
        return list(zip(x, (int(self.labels[i]) for i in indices)))

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.__getitems__([i])[0]


def batch_augment(cfg: ModelConfig, args: argparse.Namespace) -> BatchAugment:
    """The training augmentation of the flags on tensors (what train_transform does with PIL)."""
    return BatchAugment(
        img_size=cfg.img_size,
        in_chans=cfg.in_chans,
        mean=cfg.mean,
        std=cfg.std,
        crop_scale=(args.crop_scale, 1.0),
        hflip=args.hflip,
        color_jitter=args.color_jitter,
        randaug=None if args.randaug == "none" else args.randaug,
        reprob=args.reprob,
    )


def train_images(args: argparse.Namespace, cfg: ModelConfig, raw: Dataset) -> Transformed | AugmentedPixels:
    """The augmented training set on the --pipeline the flags and the data allow."""
    if args.pipeline == "pil" or (args.pipeline == "auto" and not hasattr(raw, "pixels")):
        return Transformed(raw, train_transform(cfg, args), seed=args.seed)
    if not hasattr(raw, "pixels"):
        raise DataError(
            f"--pipeline tensor needs a dataset with a pixel array (fashion-mnist, fashion-mnist-scenes), "
            f"not {args.data}; use --pipeline pil"
        )
    return AugmentedPixels(raw, batch_augment(cfg, args), seed=args.seed)


class EpochSampler(Sampler[int]):
    """Shuffled indices of one epoch, a function of (seed, epoch): padded to a multiple of the world
    size, this rank's share taken, and the first `skip` of them dropped (resuming mid-epoch)."""

    def __init__(self, n: int, *, seed: int, epoch: int, rank: int, world: int, skip: int = 0):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(seed, epoch))).tolist()
        order += order[: (-n) % world]
        self.indices = order[rank::world][skip:]

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)


def _quiet_worker(_: int) -> None:
    # Ctrl+C reaches the whole process group; the main process saves and shuts the workers down itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def make_loader(data: Dataset, *, batch_size: int, sampler, workers: int, drop_last: bool) -> DataLoader:
    return DataLoader(
        data,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        drop_last=drop_last,
        worker_init_fn=_quiet_worker if workers else None,
        generator=torch.Generator().manual_seed(0),
    )  # never touch the global RNG


@dataclass
class Data:
    """The images of a run, adapted to the model (size, channels, normalisation)."""

    train: Transformed | AugmentedPixels  # augmented training images; sample i of epoch e depends on (seed, e, i)
    val_loader: DataLoader  # this process's share of the validation images
    insight_batch: torch.Tensor  # fixed validation images for the per-epoch residual ratios and entropies
    steps_per_epoch: int
    rank: int
    world: int

    def train_loader(self, args: argparse.Namespace, epoch: int, *, skip: int) -> DataLoader:
        """Epoch `epoch`'s batches on this process, the first `skip` images left out (resuming mid-epoch)."""
        self.train.epoch = epoch
        sampler = EpochSampler(
            len(self.train), seed=args.seed, epoch=epoch, rank=self.rank, world=self.world, skip=skip
        )
        return make_loader(
            self.train, batch_size=args.batch_size, sampler=sampler, workers=args.workers, drop_last=True
        )


def load_data(args: argparse.Namespace, world: int) -> tuple[Dataset, Dataset, tuple[str, ...]]:
    """(train, val, class names) as the data source gives them (PIL images), checked to fit the run."""
    # (scenes come from the disk cache, rendered on first use)
    train_raw = build_dataset(args.data, "train", subset=args.subset, cache=True, style=args.scene_style)
    val_raw = build_dataset(args.data, "val", subset=args.val_subset, cache=True)
    if tuple(train_raw.classes) != tuple(val_raw.classes):
        raise DataError(f"train and val of {args.data} have different classes")
    if len(train_raw) // world < args.batch_size:
        raise DataError(
            f"{len(train_raw)} training images cannot fill one batch of {args.batch_size} "
            f"on each of {world} process(es); lower --batch-size or raise --subset"
        )
    return train_raw, val_raw, tuple(str(c) for c in train_raw.classes)


def build_loaders(
    args: argparse.Namespace,
    cfg: ModelConfig,
    train_raw: Dataset,
    val_raw: Dataset,
    *,
    rank: int,
    world: int,
    device: torch.device,
) -> Data:
    """The model input pipeline around the raw datasets: any dataset feeds any variant."""
    train_data = train_images(args, cfg, train_raw)
    val_data = Transformed(val_raw, eval_transform(cfg))
    val_loader = make_loader(
        torch.utils.data.Subset(val_data, range(rank, len(val_data), world)),
        batch_size=args.batch_size,
        sampler=None,
        workers=args.workers,
        drop_last=False,
    )
    insight_batch = torch.stack([val_data[i][0] for i in range(min(INSIGHT_BATCH, len(val_data)))]).to(device)
    steps = len(EpochSampler(len(train_data), seed=0, epoch=0, rank=rank, world=world)) // args.batch_size
    return Data(train_data, val_loader, insight_batch, steps, rank, world)
