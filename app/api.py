"""The /analyze API's answer as a plain function of a `LoadedModel` (no Gradio): the analysis' numbers and the
sections a call opts into (a saliency map, the causal view, the logit lens, activation patching), each in the
layout the page's JSON download uses for it."""

from __future__ import annotations

from typing import Any

from app import causal_view, mechanisms_view, session
from app.models import LoadedModel
from cait import explain
from cait.explain.attribution import checked_options
from cait.robustness import parse_corruption


def answer(
    loaded: LoadedModel,
    path: str,
    *,
    method: str,
    target: int,
    ig_steps: int,
    causal: bool,
    ig_baseline: str,
    signed: bool,
    smoothgrad_samples: int,
    smoothgrad_stdev: float,
    rollout_head_fusion: str,
    rollout_discard_ratio: float,
    seed: int,
    logit_lens: bool,
    patching: str,
) -> dict[str, Any]:
    """The answer of /analyze (`app.handlers.Handlers.analyze` says each keyword) for the image at `path`.
    Raises ImageInputError for a bad file, ValueError in one line for a bad class, method, option or corruption."""
    options = checked_options(  # the page's bounds: a bad value is one line naming the option
        ig_steps=ig_steps,
        ig_baseline=ig_baseline,
        signed=signed,
        smoothgrad_samples=smoothgrad_samples,
        smoothgrad_stdev=smoothgrad_stdev,
        rollout_head_fusion=rollout_head_fusion,
        rollout_discard_ratio=rollout_discard_ratio,
    )
    a = session.analyse(loaded, path)
    out = session.numbers(loaded, a)
    out["methods"] = list(explain.METHODS)
    target = session.api_target(a, int(target), loaded.cfg.num_classes)
    if method:
        out["attribution"] = session.attribution_for_api(
            loaded, a, method=method, target=target, options=options, seed=int(seed)
        )
    x = a.x.to(loaded.device)
    if causal:
        out["causal"] = causal_view.numbers(loaded.model, x, causal_view.compute(loaded.model, x, target))
    if logit_lens:
        out["logit_lens"] = mechanisms_view.lens(loaded.model, x, target, loaded.labels)
    if patching:
        name, severity = parse_corruption(patching)
        _, corrupted = mechanisms_view.corrupted_input(a.view, loaded.cfg, name, severity)
        out["patching"] = mechanisms_view.patching_numbers(
            loaded.model, x, corrupted.to(loaded.device), target, corruption=(name, severity)
        )
    return out
