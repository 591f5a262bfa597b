"""`python -m cait.compare`: two models side by side over a folder of images (see `cait.compare`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..flags import add_data_flags, add_device_flag, add_model_flags
from .options import CompareOptions, Side


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m cait.compare",
        description="Model A against model B over the same images: linear CKA between every two blocks, every CA "
        "head of A against every CA head of B and their one-to-one matching, the answers per class with McNemar's "
        "test, the matched heads' localisation and attribution, the images where they disagree. Resumable, and "
        "sharded over processes under torchrun.",
    )
    for side in ("a", "b"):
        add_model_flags(
            p.add_argument_group(f"model {side.upper()}"),
            side=side,
            checkpoint_help=f"model {side.upper()}'s weights file (ours, timm's or the official deit .pth)",
        )
    add_data_flags(p, sample="which N --limit takes")
    p.add_argument(
        "--atlas-a",
        type=Path,
        default=None,
        help="instead of the models and --data: a finished atlas (python -m cait.atlas) of model A; with --atlas-b, "
        "of the same images, its answers and heads' numbers are compared (no CKA, no head maps: heads paired by "
        "layer and head)",
    )
    p.add_argument("--atlas-b", type=Path, default=None, help="a finished atlas of model B over the same images")
    p.add_argument("--out", type=Path, required=True, help="output directory (a rerun into it continues)")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch, CKA's minibatch (default 64)")
    p.add_argument("--shard-size", type=int, default=256, help="images per shard file (what a resume skips)")
    p.add_argument("--stop-after", type=int, default=None, metavar="N", help="stop after N shards (rerun continues)")
    p.add_argument("--exemplars", type=int, default=6, help="disagreement images per direction on the page")
    p.add_argument("--workers", type=int, default=1, help="data loader processes (default 1)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch threads (default: torch's choice)")
    add_device_flag(p)
    args = p.parse_args(argv)
    for name in ("limit", "batch_size", "shard_size", "stop_after", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.batch_size < 4:
        p.error("--batch-size must be at least 4: CKA's unbiased estimator needs 4 images per minibatch")
    return args


def options_of(args: argparse.Namespace) -> CompareOptions:
    """The command line's flags as the library's options."""
    side = lambda s: Side(  # noqa: E731
        getattr(args, f"model_{s}"),
        getattr(args, f"checkpoint_{s}"),
        getattr(args, f"pretrained_{s}"),
        getattr(args, f"random_init_{s}"),
    )
    keep = ("data", "out", "boxes", "limit", "sample", "batch_size", "shard_size", "stop_after", "workers", "device")
    more = {k: getattr(args, k) for k in ("exemplars", "atlas_a", "atlas_b")}
    return CompareOptions(side("a"), side("b"), **{k: getattr(args, k) for k in keep}, **more)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch  # after parsing: --help and a bad flag answer without importing torch

    from .run import main_guarded

    if args.threads:
        torch.set_num_threads(args.threads)
    return main_guarded(options_of(args))


if __name__ == "__main__":
    raise SystemExit(main())
