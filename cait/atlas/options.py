"""What an atlas run is asked to do (`AtlasOptions`), torch-free: the command line builds one from its flags,
the app from its controls. The field names are the flags' (--batch-size: batch_size), and the fields that change
the numbers are what atlas_args.json records, so an atlas made either way resumes either way."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class AtlasOptions:
    """An atlas of a model over the images of `data`, written to `out` (`python -m cait.atlas`'s flags)."""

    out: Path  # the atlas's folder; a rerun with the same options continues it
    data: str  # an image folder (class folders or flat), or "fashion-mnist-scenes" (`cait.data.read_images`)
    model: str | None = None  # the variant (None: the default, or the one a checkpoint of ours names)
    checkpoint: str | None = None  # a weights file (ours, timm's or the official deit .pth)
    pretrained: bool = False  # a paper variant's official weights, from the Hugging Face Hub's cache
    random_init: bool = False  # a seeded random init when the variant has no weights here, instead of an error
    boxes: str | None = None  # COCO-format boxes (JSON) of the folder's images: localisation needs them
    limit: int | None = None  # only this many images, taken as `sample` says
    sample: str = "stratified"  # which images `limit` takes of a folder: "stratified" or "first"
    knockouts: bool = False  # also the logit change when each block is knocked out
    patching: tuple[str, int] | None = None  # also activation patching under this (corruption, severity)
    batch_size: int = 64  # images per batch
    exemplars: int = 6  # exemplar images per head and kind on the page (not recorded: only the page)
    shard_size: int = 256  # images per shard file (what a resume skips)
    stop_after: int | None = None  # stop after this many shards (the same options continue)
    workers: int = 1  # data loader processes (0: in this process, as the app runs it)
    threads: int | None = None  # torch threads per process (None: torch's choice)
    device: str = "auto"  # "auto" (CUDA when there is one), "cpu" or "cuda"
    precision: str = "fp32"  # autocast of the forward passes: "fp32", "bf16" or "auto"
    remeasure_precision: bool = False  # with precision "auto": time bf16 against fp32 again now

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> AtlasOptions:
        """The options `python -m cait.atlas`'s parsed flags ask for.

        Args:
            args: what `cait.atlas.__main__.parse_args` returns (one attribute per field).

        Returns:
            The options, every field read from its flag."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})
