"""The atlas's numbers for one batch of images, every one from its owner in `cait.explain`: the prediction,
and per class-attention head its map's entropy, its direct logit attribution to the predicted class, its
pointing hit and mass in the box (and the box's share of the image, their chance level); the SA heads' mean
attention distances; with knockouts the logit change per block; with a corruption the activation patching of
the predicted class from each image into its corrupted twin, per component and per patch of the tokens the
class stage reads. Maps, attributions and distances come from one forward pass
(`explain.causal.predicted_attribution`), whose SA states the knockouts re-use."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch
from torch import nn

from .. import explain
from ..corruptions import corrupt
from ..explain.head_stats import attention_entropy
from ..explain.metrics import box_share, head_localization
from ..explain.token_patching import region_boxes
from ..runtime import autocast

# columns of a shard and their shape after the image axis (L: CA layers, H: heads, D: SA layers, K: blocks)
HEAD_NUMBERS = ("entropy", "dla", "pointing", "mass_in_box")  # each [L, H] per image
TOKEN_REGION, TOKEN_TOP = 1, 3  # token patching: regions of one patch; the three best patched together


def head_numbers(boxes: bool) -> tuple[str, ...]:
    """The per-head numbers an atlas has: the localisation scores only on data with boxes."""
    return HEAD_NUMBERS if boxes else HEAD_NUMBERS[:2]


def _one_pass(model: nn.Module, x: torch.Tensor, boxes: torch.Tensor, *, keep_sa_inputs: bool, keep_maps: bool = False):
    """Everything but the knockouts, from one pass that keeps each SA layer's distances, not its maps
    (`explain.head_stats.distance_reduce`), and with keep_sa_inputs its SA states
    (`explain.causal.recorded_sa_inputs`), so the knockouts need no pass of their own."""
    cfg = model.cfg
    stages = ("after_proj_w",)
    reduce = explain.head_stats.distance_reduce(cfg, stages)
    with explain.causal.recorded_sa_inputs(model) if keep_sa_inputs else nullcontext([]) as sa_inputs:
        ins, dla = explain.causal.predicted_attribution(model, x, sa_layers=tuple(range(cfg.depth)), sa_reduce=reduce)
    distance = explain.head_stats.kept_distances(ins, stages)[stages[0]]
    maps = explain.ClassAttention.from_insights(ins).maps  # [B, L, H, g, g]
    probs = ins.logits.float().softmax(-1)
    prediction = dla.target
    pointing, mass = head_localization(maps, boxes, cfg.img_size)
    numbers = {
        "prediction": prediction,
        "probability": probs.gather(1, prediction[:, None])[:, 0],
        "entropy": attention_entropy(maps),
        "dla": dla.heads.float(),
        "pointing": pointing,
        "mass_in_box": mass,
        "box_share": box_share(boxes, cfg.img_size),  # the chance level of both localisation scores
        "distance": distance.float(),
    }
    if keep_maps:  # the maps themselves, for a reader that compares them (`cait.compare`)
        numbers["maps"] = maps.float()
    return numbers, sa_inputs


def corrupted_views(pixels: torch.Tensor, index: torch.Tensor, corruption: tuple[str, int]) -> torch.Tensor:
    """The unnormalised views [B, C, H, W] under `corruption` (name, severity), each image's random draws
    seeded by its index in the data: the same whatever the batch, shard or process it falls in."""
    name, severity = corruption
    return torch.cat(
        [
            corrupt(pixels[i : i + 1], name, severity, generator=torch.Generator().manual_seed(int(index[i])))
            for i in range(len(pixels))
        ]
    )


def patching_numbers(
    model: nn.Module, x: torch.Tensor, corrupted: torch.Tensor, target: torch.Tensor, boxes: torch.Tensor
) -> dict:
    """Activation patching of the `target` logits from x into `corrupted` (fp32: it subtracts logits): per
    image each block's attention and MLP branch [B, K, 2], the class token after each CA block but the last
    [B, L - 1], each CA head [B, L, H] and the clean-corrupted gap [B]; and token patching into the class
    stage per patch (`explain.token_patching`): what the best patch restores alone and the `TOKEN_TOP` best
    together [B], and the share of the best patch's area inside the object's box [B] (NaN without a box)."""
    by_block = explain.activation_patching(model, x, corrupted, target)
    by_head = explain.activation_patching(model, x, corrupted, target, granularity="head")
    tokens = explain.token_patching(
        model, x, corrupted, target, region=TOKEN_REGION, direction="restore", top=TOKEN_TOP
    )
    best_restored, best = tokens.restored.flatten(1).max(1)
    region = region_boxes(tokens.grid, tokens.region, model.cfg.patch_size).to(x.device)[best]
    return {
        "patch_branches": by_block.branches.float(),
        "patch_class_token": by_block.class_token.float(),
        "patch_heads": by_head.heads.float(),
        "patch_gap": by_block.gap.float(),
        "patch_tokens_best": best_restored.float(),
        "patch_tokens_top": tokens.top_restored.float(),
        "patch_tokens_best_in_box": share_in_box(region, boxes),
    }


def share_in_box(regions: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """The share of each region's area [B, 4] inside its image's box [B, 4] (x0, y0, x1, y1 in input pixels;
    NaN for a NaN box)."""
    wide = (torch.minimum(regions[:, 2], boxes[:, 2]) - torch.maximum(regions[:, 0], boxes[:, 0])).clamp(min=0)
    high = (torch.minimum(regions[:, 3], boxes[:, 3]) - torch.maximum(regions[:, 1], boxes[:, 1])).clamp(min=0)
    area = (regions[:, 2] - regions[:, 0]) * (regions[:, 3] - regions[:, 1])
    return torch.where(boxes.isnan().any(1), torch.nan, wide * high / area)


@torch.no_grad()
def batch_numbers(
    model: nn.Module,
    x: torch.Tensor,
    boxes: torch.Tensor,
    *,
    knockouts: bool,
    dtype: torch.dtype | None,
    corrupted: torch.Tensor | None = None,
    keep_maps: bool = False,
) -> dict[str, np.ndarray]:
    """Per image of the normalised batch x [B, C, H, W] (boxes [B, 4] in input pixels, NaN rows without):
    prediction, probability, per CA head (`HEAD_NUMBERS`) [B, L, H], SA distances [B, D, H], with
    knockouts the logit change per block [B, K], and with `corrupted` (the normalised corrupted batch) the
    activation patching of the predicted class (`patching_numbers`), with keep_maps the class-attention maps
    [B, L, H, g, g], as numpy arrays. dtype: the autocast dtype (None: fp32)."""
    boxes = boxes.to(x.device).float()
    with autocast(dtype, x.device):
        out, sa_inputs = _one_pass(model, x, boxes, keep_sa_inputs=knockouts, keep_maps=keep_maps)
        if knockouts:  # from the pass's own SA states: one forward fewer than knockout_profile alone
            out["knockout"] = explain.knockout_profile(model, x, out["prediction"], sa_inputs=sa_inputs).float()
    if corrupted is not None:
        out |= patching_numbers(model, x, corrupted, out["prediction"], boxes)
    return {k: v.cpu().numpy() for k, v in out.items()}
