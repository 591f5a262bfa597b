"""What a comparison run is asked to do (`CompareOptions`), torch-free: the command line builds one from its
flags, the app from its controls."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

Head = tuple[int, int]  # a CA head as (layer, head), both numbered from 1 as in every file


@dataclass(frozen=True)
class Side:
    """One model of a comparison, as `cait.load_model` takes it: a variant name and/or a checkpoint file,
    `pretrained` for a paper variant's official weights, `random_init` to accept a seeded random init when the
    variant has no weights here."""

    model: str | None = None
    checkpoint: str | None = None
    pretrained: bool = False
    random_init: bool = False


@dataclass(frozen=True)
class CompareOptions:
    """A comparison of model `a` against model `b` over the images of `data`, written to `out`.

    Fields:
        a, b: the two models (`Side`).
        data: an image folder (class folders or flat) or "fashion-mnist-scenes", read as the atlas reads it
            (`cait.data.read_images`), each model through its own preprocessing.
        out: the run's folder; a rerun with the same options continues it.
        boxes: COCO-format boxes of the folder's images (pointing game and mass in box need them).
        limit, sample: only `limit` images, taken as `cait.data.read_images` takes them.
        batch_size: images per batch, which is also CKA's minibatch (the minibatch estimator depends on it, so
            it is recorded: a rerun with another one is refused, as the atlas refuses other arguments).
        shard_size: images per shard file (what a resume skips).
        stop_after: stop after this many shards (the same options continue).
        workers: data loader processes.
        device: "auto", "cpu" or "cuda".
        exemplars: disagreement images shown on the page per direction (A right B wrong, and the reverse).
        atlas_a, atlas_b: instead of a, b and data, two finished atlases (`python -m cait.atlas`) of the same
            images: the answers and the heads' numbers are read from them (no CKA, no head similarity: an atlas
            keeps neither representations nor maps; heads paired by layer and head).
    """

    a: Side = Side()
    b: Side = Side()
    data: str | None = None
    out: Path | None = None
    boxes: str | None = None
    limit: int | None = None
    sample: str = "stratified"
    batch_size: int = 64
    shard_size: int = 256
    stop_after: int | None = None
    workers: int = 1
    device: str = "auto"
    exemplars: int = 6
    atlas_a: Path | None = None
    atlas_b: Path | None = None


class CompareError(InputError):
    """A comparison that cannot be made as asked; the message is one line."""


def check_comparable(model_a, model_b) -> list[str]:
    """The two models' shared class names; CompareError when they differ (their answers cannot be compared).

    Args:
        model_a, model_b: CaiTs from `cait.load_model`.

    Returns:
        The class names, in the models' order.
    """
    from ..preprocess import class_names  # here: the options stay importable without torch

    names_a, names_b = list(class_names(model_a.cfg)), list(class_names(model_b.cfg))
    if names_a != names_b:
        raise CompareError(
            f"the two models answer different classes ({len(names_a)} classes, first {names_a[:3]}, against "
            f"{len(names_b)}, first {names_b[:3]}): their answers cannot be compared"
        )
    return names_a
