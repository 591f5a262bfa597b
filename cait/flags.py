"""The command-line flags every tool shares, declared once: which model (--model, --checkpoint, --pretrained,
--random-init), which images (--data, --boxes, --limit, --sample) and where and in which precision it runs
(--device, --precision). Torch-free, so --help answers at once."""

from __future__ import annotations

import argparse

from .config import DEFAULT_MODEL, list_models

DEVICES = ("auto", "cpu", "cuda")  # auto = CUDA when there is one, else the CPU
PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # auto = bf16 where it measures faster than fp32, else fp32
INFERENCE_PRECISIONS = ("auto", "fp32", "bf16")  # fp16 only trains (CUDA, with a loss scaler)


def add_model_flags(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    checkpoint_help: str = "weights file: ours (.safetensors, carries its config), timm's or the official deit .pth",
    pretrained_help: str = "a paper variant's official weights (timm's files on the Hugging Face Hub): from "
    "the local cache, downloaded once when missing (HF_HUB_OFFLINE=1: the cache only)",
    side: str = "",
) -> None:
    """--model, --checkpoint, --pretrained and --random-init: what `cait.load_model` takes. Its policy for missing
    weights, the same in every tool: a variant without weights here (not shipped, not in the local Hugging Face
    cache) is an error naming the ways out, unless --random-init asks for a seeded random init. side: a tool of
    two models names each one's flags with it (side "a": --model-a, --checkpoint-a, ..., read as args.model_a)."""
    suffix = f"-{side}" if side else ""
    p.add_argument(
        f"--model{suffix}",
        default=None,
        metavar="VARIANT",
        choices=list_models(),
        help=(
            f"variant name (default {DEFAULT_MODEL}, or the one a checkpoint of ours describes; timm and deit "
            if not side
            else f"model {side.upper()}'s variant name (no default: give it or a checkpoint of ours; timm and deit "
        )
        + f"files need it): {', '.join(list_models())}",
    )
    p.add_argument(f"--checkpoint{suffix}", default=None, help=checkpoint_help)
    p.add_argument(f"--pretrained{suffix}", action="store_true", help=pretrained_help)
    p.add_argument(
        f"--random-init{suffix}",
        action="store_true",
        help="when the variant has no weights here (not shipped, not in the local Hugging Face cache), a seeded "
        "random init, said on every output (RANDOM INIT), instead of an error naming the ways out (--pretrained, "
        "--checkpoint FILE, HF_HOME)",
    )


def add_device_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--device", default="auto", choices=DEVICES, help="auto = CUDA when there is one, else the CPU")


def add_precision_flag(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    help: str,
    default: str = "auto",
    choices: tuple[str, ...] = INFERENCE_PRECISIONS,
) -> None:
    """--precision: the autocast dtype of the passes `help` names (cait.runtime says what auto means), and
    --remeasure-precision to time auto's choice again rather than trust the stored timing."""
    p.add_argument("--precision", default=default, choices=choices, help=help)
    p.add_argument(
        "--remeasure-precision",
        action="store_true",
        help="with --precision auto: time bf16 against fp32 again now instead of using the timing kept for this "
        "CPU, torch version and thread count",
    )


def add_threads_flag(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    default: int | None = None,
    help: str = "torch threads (default: torch's choice; 1 is fastest on a busy machine)",
) -> None:
    """--threads: how many threads torch uses (None: torch's own choice, one per core)."""
    # type int, not a checking function: cait.train converts flags given from Python by their type
    p.add_argument("--threads", type=int, default=default, metavar="N", help=help)


SAMPLES = ("stratified", "first")  # how --limit picks its images from a folder (`cait.data.limit_subset`)
SAMPLE_HELP = (
    "which N images --limit takes from a folder: stratified (default: a seeded share of each class folder, of a "
    "flat folder a seeded random N) or first (the first N in folder order)"
)


def add_data_flags(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    default: str | None = None,
    required: bool = False,
    help: str = "an image folder (class folders or flat), or fashion-mnist-scenes",
    boxes: str | None = "COCO-format boxes (JSON) of the folder's images",
    boxes_metavar: str | None = None,
    limit: str | None = "only N images (of a folder: see --sample)",
    limit_aliases: tuple[str, ...] = (),
    limit_default: int | None = None,
    sample: str | None = SAMPLE_HELP,
) -> None:
    """The image-set flags every command reads through `cait.data.read_from_flags`: --data (`default`, or
    `required`), --boxes, --limit (with `limit_aliases`, e.g. "--subset") and --sample. Each help is the command's
    own sentence; a help of None leaves that flag out (a command without boxes, or with its own count)."""
    p.add_argument("--data", required=required, default=default, help=help)
    if boxes is not None:
        p.add_argument("--boxes", default=None, metavar=boxes_metavar, help=boxes)
    if limit is not None:
        p.add_argument("--limit", *limit_aliases, dest="limit", type=int, default=limit_default, help=limit)
    if sample is not None:
        p.add_argument("--sample", choices=SAMPLES, default="stratified", help=sample)
