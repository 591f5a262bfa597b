"""One image through two models side by side: both top-5, every class-attention head's map of both, paired by a
compare run's matching (or by layer and head), the difference of each pair's maps where the two grids match, the
direct logit attribution of every CA head of both to one class, |gamma| per depth and the image's residual-branch
ratios of both. Each number is `cait.explain`'s (or `forward_insights`') for that model alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from ..explain import direct_logit_attribution
from ..explain._checks import ExplainInputError, check_class_stage, check_input
from ..explain.attention import ClassAttention
from ..explain.causal import predicted_attribution
from ..explain.layerscale import layerscale_stats
from .options import Head, check_comparable

TOP = 5  # predictions shown per model


@dataclass
class ImageComparison:
    """One image as model A and model B see it (each through its own preprocessing).

    Fields:
        top_a, top_b: each model's top-5 as (class index, probability), most probable first.
        target: the class both models' heads are attributed to (A's top class unless asked).
        maps_a, maps_b: every CA head's map [layers, heads, g, g] of each model.
        pairs: the heads shown side by side, ((layer_a, head_a), (layer_b, head_b)), numbered from 1.
        differences: per pair, B's map minus A's [g, g], or None where the two grids differ.
        dla_a, dla_b: each CA head's direct write to the target's logit [layers, heads].
        gamma_a, gamma_b: mean |gamma| per depth, by "sa gamma_1", "sa gamma_2", "ca gamma_1", "ca gamma_2".
        ratios_a, ratios_b: the image's residual-branch ratio per depth, by "sa", "ffn", "ca", "ca_ffn".
    """

    top_a: list[tuple[int, float]]
    top_b: list[tuple[int, float]]
    target: int
    maps_a: np.ndarray
    maps_b: np.ndarray
    pairs: list[tuple[Head, Head]]
    differences: list[np.ndarray | None]
    dla_a: np.ndarray
    dla_b: np.ndarray
    gamma_a: dict[str, list[float]]
    gamma_b: dict[str, list[float]]
    ratios_a: dict[str, list[float]]
    ratios_b: dict[str, list[float]]


@dataclass
class Seen:
    """What one pass of a model already gave for the image (the app's analysis, say), so that it is not run
    again: its class probabilities [K], every CA head's map [layers, heads, g, g] and its residual-branch ratios
    per depth, by "sa", "ffn", "ca", "ca_ffn"."""

    probs: np.ndarray
    maps: np.ndarray
    ratios: dict[str, list[float]]


def compare_image(
    model_a: nn.Module,
    x_a: torch.Tensor,
    model_b: nn.Module,
    x_b: torch.Tensor,
    *,
    matching: Sequence[tuple[Head, Head, float]] | None = None,
    target: int | None = None,
    seen_a: Seen | None = None,
) -> ImageComparison:
    """One image compared across two models of the same classes.

    Args:
        model_a, model_b: CaiTs from `cait.load_model` with a class-attention stage, answering the same classes.
        x_a, x_b: the image as each model sees it, a normalised batch [1, C, H, W] of that model's input shape.
        matching: a compare run's head matching (`CompareRun.matching`, heads numbered from 1); None pairs the
            heads by layer and head, as far as both have them.
        target: the class the heads' direct logit attribution is of (default: model A's top class).
        seen_a: what a pass of model A on `x_a` already gave (its answer, maps and ratios): A's side then costs
            only the pass its direct logit attribution needs.

    Returns:
        `ImageComparison`.
    """
    for model, x, side in ((model_a, x_a, "a"), (model_b, x_b, "b")):
        check_input(model, x, name=f"x_{side}")
        check_class_stage(model)
        if x.shape[0] != 1:
            raise ExplainInputError(f"x_{side} must hold one image, got a batch of {x.shape[0]}")
    check_comparable(model_a, model_b)
    if target is not None and not 0 <= int(target) < model_a.cfg.num_classes:
        raise ExplainInputError(f"target must be a class in 0..{model_a.cfg.num_classes - 1}, got {target}")
    dla_a = None
    if seen_a is None:  # one pass: the maps, the answer, the ratios and the heads' writes
        insights_a, dla_a = predicted_attribution(model_a, x_a, target=target)
        seen_a = _seen(insights_a)
    top_a = _top(torch.as_tensor(seen_a.probs))
    target = top_a[0][0] if target is None else int(target)
    if dla_a is None:
        dla_a = direct_logit_attribution(model_a, x_a, target)
    insights_b, dla_b = predicted_attribution(model_b, x_b, target=target)
    seen_b = _seen(insights_b)
    maps_a, maps_b = seen_a.maps, seen_b.maps
    pairs = _pairs(maps_a.shape[:2], maps_b.shape[:2], matching)
    same_grid = maps_a.shape[2:] == maps_b.shape[2:]
    differences = [
        maps_b[lb - 1, hb - 1] - maps_a[la - 1, ha - 1] if same_grid else None for (la, ha), (lb, hb) in pairs
    ]
    heads = [d.heads[0].detach().float().cpu().numpy() for d in (dla_a, dla_b)]
    return ImageComparison(
        top_a, _top(torch.as_tensor(seen_b.probs)), target, maps_a, maps_b, pairs, differences, *heads,
        gamma_a=gamma_per_depth(model_a), gamma_b=gamma_per_depth(model_b),
        ratios_a=seen_a.ratios, ratios_b=seen_b.ratios,
    )  # fmt: skip


def _seen(insights) -> Seen:
    probs = insights.logits[0].detach().float().softmax(-1).cpu().numpy()
    maps = ClassAttention.from_insights(insights).maps[0].detach().float().cpu().numpy()
    return Seen(probs, maps, _ratios(insights))


def _top(probs: torch.Tensor) -> list[tuple[int, float]]:
    probs = probs.detach().float()
    values, indices = probs.topk(min(TOP, probs.numel()))
    return [(int(i), float(v)) for i, v in zip(indices, values)]


def _pairs(shape_a: tuple, shape_b: tuple, matching) -> list[tuple[Head, Head]]:
    """The heads shown side by side: the matching's pairs (checked against both models), else layer by layer
    and head by head as far as both have them."""
    if matching is None:
        return [
            ((l + 1, h + 1),) * 2
            for l in range(min(shape_a[0], shape_b[0]))
            for h in range(min(shape_a[1], shape_b[1]))
        ]
    pairs = []
    for head_a, head_b, *_ in matching:
        for (layer, head), (layers, heads), side in ((head_a, shape_a, "A"), (head_b, shape_b, "B")):
            if not (1 <= layer <= layers and 1 <= head <= heads):
                raise ExplainInputError(
                    f"matching names CA head {layer}.{head} of model {side}, which has {layers} CA layers of "
                    f"{heads} heads: is it the matching of another pair of models?"
                )
        pairs.append((tuple(head_a), tuple(head_b)))
    return pairs


def gamma_per_depth(model: nn.Module) -> dict[str, list[float]]:
    """Mean |gamma| of each block, in depth order, by stage and gamma (`cait.explain` LayerScale statistics)."""
    out: dict[str, list[float]] = {}
    for row in layerscale_stats(model):
        out.setdefault(f"{row['stage']} {row['gamma']}", []).append(row["mean"])
    return out


def _ratios(insights) -> dict[str, list[float]]:
    return {kind: values[0].float().cpu().tolist() for kind, values in insights.residual_ratios.items()}
