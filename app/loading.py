"""The app's one way to load a model for its pages: through the library's one door (`cait.load_model`), moved
to the device and frozen, with everything the page shows about it (labels, examples, model card) as a
`LoadedModel`."""

from __future__ import annotations

from pathlib import Path

import torch

import cait
from app.examples import find_examples
from app.models import LoadedModel, ModelChoice
from app.workdir import WORK
from cait.preprocess import class_names
from cait.provenance import shipped_card
from cait.runtime import PrecisionChoice


def load_page_model(
    choice: ModelChoice,
    device: torch.device,
    dtype: torch.dtype | None = None,
    precision: PrecisionChoice | None = None,
) -> LoadedModel:
    """The model `choice` names on `device`, as the pages take it (`cait.load_model`, then frozen). Raises
    cait.CheckpointError / ValueError with a one-line reason."""
    sourced = cait.load_model(
        choice.name, choice.checkpoint, pretrained=choice.download, random_init=choice.random_init
    )
    # Frozen for good: the gradient methods need d/d(input) only, and two sessions may run them at once on
    # this shared model (explain's temporary freezing is not meant for concurrent callers).
    model = sourced.model.requires_grad_(False).to(device)
    # the variant's name, else the file's: the page never calls a 16-head model by a 4-head variant's name
    name = sourced.name or Path(choice.checkpoint).name
    return LoadedModel(
        model=model,
        choice=choice,
        name=name,
        source=sourced.source,
        notice=sourced.notice,
        status=sourced.status,
        device=device,
        dtype=dtype,
        labels=class_names(model.cfg),
        examples=find_examples(model.cfg, WORK.path),
        card=shipped_card(model.cfg) if choice.checkpoint is None else None,
        sourced=sourced,
        precision=precision,
    )
