"""Every explanation of a CaiT prediction that the app, `cait.evaluate` and the analysis scripts show.

All functions take a normalised batch x [B, C, H, W] and a model from `cait.create_model`; heat maps
are on the patch grid [B, g, g] (higher = more important), boxes are [B, 4] (x0, y0, x1, y1) in input
pixels. `METHODS[name](model, x, target)` runs any method by name (target: LongTensor [B]).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .attention import (ClassAttention, TalkingHeads, class_attention, class_specific_attention, rollout,
                        talking_heads)
from .attribution import CAPTUM_METHODS, Attribution, attribution, patch_sum
from .layerscale import layerscale_stats, layerscale_stats_from_metrics
from .maps import DEFAULT_SHARE, mask_to_boxes, overlay, regions_of_focus, upsample
from .metrics import deletion_insertion, mass_in_box, pointing_game

Method = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def _ca_mean(layer: int) -> Method:
    # target is unused: plain class attention does not depend on the class asked about
    return lambda model, x, target: class_attention(model, x).mean[:, layer]


def _captum(method: str) -> Method:
    return lambda model, x, target: attribution(model, x, target, method).patch


METHODS: dict[str, Method] = {
    "ca1_mean": _ca_mean(0),
    "ca2_mean": _ca_mean(1),
    "class_specific": class_specific_attention,
    "rollout_before_mixing": lambda model, x, target: rollout(model, x, mixing="before"),
    "rollout_after_mixing": lambda model, x, target: rollout(model, x, mixing="after"),
    **{name: _captum(name) for name in CAPTUM_METHODS},
}

__all__ = ["Attribution", "CAPTUM_METHODS", "ClassAttention", "DEFAULT_SHARE", "METHODS", "TalkingHeads",
           "attribution", "class_attention", "class_specific_attention", "deletion_insertion",
           "layerscale_stats", "layerscale_stats_from_metrics", "mask_to_boxes", "mass_in_box", "overlay",
           "patch_sum", "pointing_game", "regions_of_focus", "rollout", "talking_heads", "upsample"]
