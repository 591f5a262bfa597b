"""`python -m cait.atlas`: the head atlas of a model over a folder of images (see `cait.atlas`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import InputError
from ..flags import add_data_flags, add_device_flag, add_model_flags, add_precision_flag, add_threads_flag
from .options import AtlasOptions


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m cait.atlas",
        description="Per class-attention head over a dataset: entropy, direct logit attribution, localisation, "
        "exemplars; SA attention distances; with --knockouts the logit change per block; with --patching the "
        "share of a corruption's logit gap each component and each patch's tokens restore. Resumable, and "
        "sharded over processes under torchrun.",
    )
    add_model_flags(p)
    add_data_flags(p, required=True)
    p.add_argument("--out", type=Path, required=True, help="output directory (a rerun into it continues)")
    p.add_argument("--knockouts", action="store_true", help="also the logit change when each block is knocked out")
    p.add_argument(
        "--patching",
        default=None,
        type=_corruption,
        metavar="CORRUPTION:SEVERITY",
        help="also activation patching of the predicted class from each image into itself under this ImageNet-C "
        "corruption (cait.corruptions, e.g. gaussian_noise:3): per branch, CA class token and CA head, the share "
        "of the gap restored, and token patching into the class stage per patch (what the best patch and the 3 "
        "best restore, the best patch's share in the box); always fp32",
    )
    p.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    p.add_argument("--exemplars", type=int, default=6, help="exemplar images per head and kind on the page")
    p.add_argument("--shard-size", type=int, default=256, help="images per shard file (what a resume skips)")
    p.add_argument(
        "--stop-after", type=int, default=None, metavar="N", help="stop after N shards (the same command continues)"
    )
    p.add_argument("--workers", type=int, default=1, help="data loader processes (default 1)")
    add_threads_flag(p, help="torch threads per process (default: torch's choice; 1 is fastest on a busy machine)")
    add_device_flag(p)
    add_precision_flag(p, default="fp32", help="autocast of the forward passes: fp32 (default), bf16 or auto")
    args = p.parse_args(argv)
    for name in ("limit", "batch_size", "shard_size", "stop_after", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.exemplars < 0 or args.workers < 0:
        p.error("--exemplars and --workers must not be negative")
    return args


def _corruption(text: str) -> tuple[str, int]:
    """--patching's value parsed once, here: (corruption, severity)."""
    from ..robustness import parse_corruption

    try:
        return parse_corruption(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from .run import main_guarded  # after parsing: --help and a bad flag answer without importing torch

    return main_guarded(AtlasOptions.from_flags(args))


if __name__ == "__main__":
    raise SystemExit(main())
