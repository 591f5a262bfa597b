"""Training throughput of our CaiT against timm's Cait: same config, same weights, same batches, same run.

    python benchmarks/train_speed.py --model cait_nano_64 --batch-size 64

One step = forward + cross-entropy + backward + AdamW step, with bf16 autocast and in fp32. The two
models alternate in short rounds so that load from other processes hits both alike (cait.timing); the
figure per model is the median round. Prints images/s and the ratio ours / timm (goal: >= 1.0).
"""
from __future__ import annotations

import argparse
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

import cait
from cait.reference import timm_cait
from cait.runtime import autocast
from cait.timing import time_interleaved


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=cait.DEFAULT_MODEL, help="variant from cait.list_models()")
    p.add_argument("--batch-size", type=int, default=64, help="images per step")
    p.add_argument("--rounds", type=int, default=5, help="alternating timing rounds per model and precision")
    p.add_argument("--steps", type=int, default=5, help="training steps per round")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    ours = cait.create_model(args.model)
    theirs = timm_cait(ours.cfg, ours.state_dict())
    cfg = ours.cfg
    x = torch.randn(args.batch_size, cfg.in_chans, cfg.img_size, cfg.img_size)
    y = torch.randint(0, cfg.num_classes, (args.batch_size,))
    with torch.no_grad():  # same function before timing anything
        gap = (ours.eval()(x) - theirs.eval()(x)).abs().max().item()
    print(f"{args.model}, batch {args.batch_size}, {torch.get_num_threads()} threads; "
          f"max |logit difference| ours vs timm: {gap:.2e}")

    print(f"{'precision':<10}{'ours img/s':>12}{'timm img/s':>12}{'ratio':>8}")
    for label, amp in (("bf16", torch.bfloat16), ("fp32", None)):
        steps = {"ours": train_step(ours.train(), x, y, amp), "timm": train_step(theirs.train(), x, y, amp)}
        # warm-up: kernel selection, allocator, optimizer state
        sec = time_interleaved(steps, repeats=args.rounds, warmup=2, calls=args.steps, desc=label)
        a, b = len(x) / sec["ours"], len(x) / sec["timm"]
        print(f"{label:<10}{a:>12.1f}{b:>12.1f}{a / b:>8.3f}")


if __name__ == "__main__":
    main()
