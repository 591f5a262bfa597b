"""Training input speed on Fashion-MNIST scenes, in one run: the PIL pipeline (render each scene, then
timm's PIL transforms image by image) against the cached tensor pipeline (memory-mapped pixels, the
batch augmented on tensors), against the model's training step alone, and whole training steps fed by
each pipeline.

    python benchmarks/data_speed.py --model cait_nano_64 --batch-size 128 --workers 1

Both pipelines run cait.train's default recipe (RandAugment, random erasing, ...) through its own
loader, sampler and seeding. The model step is forward + loss + backward + AdamW with `--precision auto`'s
precision (bf16 only where it measures faster than fp32). Prints images/s and each row's ratio to the
PIL pipeline; the first-use cache build is not timed (it is done before, with a progress bar).
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

import cait
from cait.data import build_dataset
from cait.flags import add_threads_flag
from cait.runtime import autocast, autocast_dtype
from cait.train.args import model_config, train_args
from cait.train.data import EpochSampler, make_loader, train_images


def loader_for(args: argparse.Namespace, pipeline: str, cache: bool) -> Iterable:
    """Batches of epoch 0 as cait.train makes them, on `pipeline`, rendering or reading the cache."""
    flags = train_args(
        model=args.model,
        data="fashion-mnist-scenes",
        batch_size=args.batch_size,
        workers=args.workers,
        pipeline=pipeline,
    )
    raw = build_dataset("fashion-mnist-scenes", "train", cache=cache)
    cfg = model_config(flags, num_classes=len(raw.classes), labels=tuple(raw.classes))
    images = train_images(flags, cfg, raw)
    sampler = EpochSampler(len(images), seed=0, epoch=0, rank=0, world=1)
    return make_loader(images, batch_size=args.batch_size, sampler=sampler, workers=args.workers, drop_last=True)


def rate(batches: Iterable, work: Callable[[torch.Tensor, torch.Tensor], None], count: int) -> float:
    """Images/s of `work` over `count` batches, after one untimed batch (worker start-up, first calls)."""
    it = iter(batches)
    work(*next(it))
    start, seen = time.perf_counter(), 0
    for x, y in itertools.islice(it, count):
        work(x, y)
        seen += len(y)
    return seen / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=cait.DEFAULT_MODEL, help="variant from cait.list_models()")
    p.add_argument("--batch-size", type=int, default=128, help="images per step")
    p.add_argument("--workers", type=int, default=1, help="DataLoader worker processes (cait.train's --workers)")
    p.add_argument("--batches", type=int, default=12, help="timed batches per measurement")
    add_threads_flag(p)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    build_dataset("fashion-mnist-scenes", "train", cache=True)  # first use renders the cache: not timed
    device = torch.device("cpu")
    amp = autocast_dtype("auto", device)
    model = cait.load_model(args.model, weights=False, num_classes=10).model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with autocast(amp, device):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    fixed = next(iter(loader_for(args, "tensor", cache=True)))
    pipelines = {
        "PIL: render + PIL transforms": ("pil", False),
        "PIL transforms on the cache": ("pil", True),
        "tensor: cache + batched tensor augmentation": ("tensor", True),
    }
    rows = {
        f"data only, {name}": rate(loader_for(args, *how), lambda x, y: None, args.batches)
        for name, how in pipelines.items()
    }
    rows["model step only (one fixed batch)"] = rate(itertools.repeat(fixed), step, args.batches)
    for name in ("PIL: render + PIL transforms", "tensor: cache + batched tensor augmentation"):
        rows[f"train step fed by {name.split(':')[0]}"] = rate(loader_for(args, *pipelines[name]), step, args.batches)

    print(
        f"{args.model}, batch {args.batch_size}, {args.workers} loader worker(s), {torch.get_num_threads()} threads, "
        f"model step in {amp or 'fp32'}; {args.batches} batches per row"
    )
    base = rows["data only, PIL: render + PIL transforms"]
    print(f"{'':<60}{'img/s':>9}{'x PIL':>8}")
    for name, value in rows.items():
        print(f"{name:<60}{value:>9.0f}{value / base:>8.2f}")


if __name__ == "__main__":
    main()
