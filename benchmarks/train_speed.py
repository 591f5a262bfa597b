"""Training throughput of our CaiT against timm's Cait: same config, same weights, same batches, same run.

    python benchmarks/train_speed.py --model cait_nano_64 --batch-size 64
    python benchmarks/train_speed.py --model timm:resnet10t --img-size 112 --batch-size 128

The second compares a distillation teacher as `cait.train` trains it (`TimmCNN`, channels-last) with the
same timm CNN as `timm.create_model` builds it (NCHW).

One step = forward + cross-entropy + backward + AdamW step, with bf16 autocast and in fp32. The two
models alternate in short rounds so that load from other processes hits both alike (cait/timing.py); the
figure per model is the median round. Prints images/s and the ratio ours / timm (goal: >= 1.0).
"""

from __future__ import annotations

import argparse
from typing import Callable

import timm
import torch
import torch.nn.functional as F
from torch import nn

import cait
from cait.cnn import TimmCNN
from cait.config import CNNConfig
from cait.flags import add_threads_flag
from cait.reference import timm_cait
from cait.runtime import autocast
from cait.timing import time_interleaved
from cait.train.teacher import cnn_arch


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, amp: torch.dtype | None) -> Callable[[], None]:
    """One training step of `model` on (x, y), as a function to time."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        with autocast(amp, torch.device("cpu")):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def models(name: str, img_size: int | None) -> tuple[nn.Module, nn.Module]:
    """(ours, timm's) with the same weights: our CaiT and timm's Cait, or a TimmCNN and the bare timm CNN."""
    arch = cnn_arch(name)
    if arch is None:
        ours = cait.load_model(name, weights=False, **({"img_size": img_size} if img_size else {})).model
        return ours, timm_cait(ours.cfg, ours.state_dict())
    ours = TimmCNN(CNNConfig(arch=arch, img_size=img_size or 64))
    theirs = timm.create_model(arch, pretrained=False, num_classes=ours.cfg.num_classes)
    theirs.load_state_dict(ours.net.state_dict())
    theirs.cfg = ours.cfg
    return ours, theirs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", default=cait.DEFAULT_MODEL, help="variant from cait.list_models(), or timm:NAME for a teacher CNN"
    )
    p.add_argument("--img-size", type=int, default=None, help="input side (default: the variant's; 64 for a CNN)")
    p.add_argument("--batch-size", type=int, default=64, help="images per step")
    p.add_argument("--rounds", type=int, default=5, help="alternating timing rounds per model and precision")
    p.add_argument("--steps", type=int, default=5, help="training steps per round")
    add_threads_flag(p)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    ours, theirs = models(args.model, args.img_size)
    cfg = ours.cfg
    x = torch.randn(args.batch_size, cfg.in_chans, cfg.img_size, cfg.img_size)
    y = torch.randint(0, cfg.num_classes, (args.batch_size,))
    with torch.no_grad():  # same function before timing anything
        gap = (ours.eval()(x) - theirs.eval()(x)).abs().max().item()
    print(
        f"{args.model}, batch {args.batch_size}, {torch.get_num_threads()} threads; "
        f"max |logit difference| ours vs timm: {gap:.2e}"
    )

    print(f"{'precision':<10}{'ours img/s':>12}{'timm img/s':>12}{'ratio':>8}")
    for label, amp in (("bf16", torch.bfloat16), ("fp32", None)):
        steps = {"ours": train_step(ours.train(), x, y, amp), "timm": train_step(theirs.train(), x, y, amp)}
        # warm-up: kernel selection, allocator, optimizer state
        sec = time_interleaved(steps, repeats=args.rounds, warmup=2, calls=args.steps, desc=label)
        a, b = len(x) / sec["ours"], len(x) / sec["timm"]
        print(f"{label:<10}{a:>12.1f}{b:>12.1f}{a / b:>8.3f}")


if __name__ == "__main__":
    main()
