"""Cost of each corruption (cait.corruptions) relative to one forward pass of the shipped model, same batch.

    .venv/bin/python benchmarks/corruption_cost.py                 # cait_micro_136, 32 test scenes, severities 1, 3, 5
    .venv/bin/python benchmarks/corruption_cost.py --model cait_nano_28 --batch 64 --repeats 3

Issue 31's goal: corrupting costs at most 10% over a clean evaluation per image. The forward runs in fp32 as
evaluate's fp32 pass does (a bf16 forward would be faster and the ratios larger: --precision bf16 to see).
"""

from __future__ import annotations

import argparse

import torch
import torchvision.transforms.v2.functional as TF

from cait.corruptions import CORRUPTIONS, corrupt
from cait.data import build_dataset
from cait.factory import load_from_flags
from cait.flags import add_model_flags, add_precision_flag
from cait.preprocess import model_view
from cait.runtime import autocast, choose_precision
from cait.timing import time_interleaved

GOAL = 0.10  # corrupting a batch costs at most 10% of one forward of that batch


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(p)
    p.add_argument("--data", default="fashion-mnist-scenes")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--severities", type=int, nargs="+", default=[1, 3, 5])
    p.add_argument("--repeats", type=int, default=5)
    add_precision_flag(p, default="fp32", help="of the forward the corruptions are weighed against")
    args = p.parse_args(argv)
    model = load_from_flags(args).model.eval()
    data = build_dataset(args.data, "val", subset=args.batch, cache=True)
    x = torch.stack(
        [TF.to_dtype(TF.pil_to_tensor(model_view(data[i][0], model.cfg)), scale=True) for i in range(len(data))]
    )
    precision = choose_precision(args.precision, torch.device("cpu"), remeasure=args.remeasure_precision)
    dtype = precision.dtype

    def forward() -> None:
        with torch.inference_mode(), autocast(dtype, torch.device("cpu")):
            model(TF.normalize(x, model.cfg.mean, model.cfg.std))

    fns = {"forward": forward}
    for name in CORRUPTIONS:
        for s in args.severities:
            fns[f"{name}:{s}"] = lambda name=name, s=s: corrupt(x, name, s, generator=torch.Generator().manual_seed(0))
    seconds = time_interleaved(fns, repeats=args.repeats, desc="rounds")
    fwd = seconds.pop("forward")
    print(
        f"{args.model}, batch {args.batch}, {precision.name} forward {1e3 * fwd / args.batch:.2f} ms/image, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"{'corruption':<22}{'ms/image':>10}{'x forward':>11}")
    for name, t in seconds.items():
        flag = "" if t / fwd <= GOAL else "  over the 10% goal"
        print(f"{name:<22}{1e3 * t / args.batch:>10.3f}{t / fwd:>11.3f}{flag}")
    print(f"worst: {max(seconds, key=seconds.get)} {max(seconds.values()) / fwd:.3f}x one forward")


if __name__ == "__main__":
    main()
