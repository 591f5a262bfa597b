"""Explanations of a CaiT prediction: where the model looks and what matters for its answer.

Every function takes a model from `cait.load_model` and a normalised batch x [B, C, H, W]
(`cait.preprocess.normalise`), and, where it explains a class, target [B] (class indices; one int for every
image); each checks them at the door and raises `cait.InputError` naming the argument. Heat maps are on the
patch grid [B, g, g] (higher = more important); layers, heads and blocks are indexed from 0.

The top level holds what a user calls, with the types it returns:

- where it looks: `class_attention`, `class_specific_attention`, `rollout`, `gradient_rollout`, `talking_heads`,
  captum's methods through `attribution`; any of them by name: `saliency_map(s)`, `METHODS`, each method's
  settings in `MethodOptions` (`method_options` declares them)
- what matters: `direct_logit_attribution`, `knockout_profile`, `head_ablation`/`all_head_ablations`
- how the answer forms: `logit_lens`, `activation_patching`, `token_patching` (per patch region into the
  class stage)
- how good a map is: `pointing_game`, `mass_in_box`, `deletion_insertion`

The rest is imported from its module: `attention` (rollouts of every stage, the talking-heads matrices),
`attribution` (captum's options and baselines), `causal`, `mechanisms`, `token_patching` (regions and their
sums), `maps` (upsampling, overlays, regions of focus), `metrics` (head localisation, the deletion/insertion
ends), `head_stats` (attention distance and entropy), `layerscale` (LayerScale statistics), `agreement`.
"""

from .attention import (
    ClassAttention,
    TalkingHeads,
    class_attention,
    class_specific_attention,
    gradient_rollout,
    rollout,
    talking_heads,
)
from .attribution import Attribution, MethodOptions, attribution, method_options
from .causal import (
    HeadAblation,
    LogitAttribution,
    all_head_ablations,
    direct_logit_attribution,
    head_ablation,
    knockout_profile,
)
from .mechanisms import Patching, activation_patching, logit_lens
from .methods import METHODS, saliency_map, saliency_maps
from .metrics import deletion_insertion, mass_in_box, pointing_game
from .token_patching import TokenPatching, token_patching

__all__ = [
    "activation_patching",
    "all_head_ablations",
    "attribution",
    "Attribution",
    "class_attention",
    "class_specific_attention",
    "ClassAttention",
    "deletion_insertion",
    "direct_logit_attribution",
    "gradient_rollout",
    "head_ablation",
    "HeadAblation",
    "knockout_profile",
    "logit_lens",
    "LogitAttribution",
    "mass_in_box",
    "method_options",
    "MethodOptions",
    "METHODS",
    "Patching",
    "pointing_game",
    "rollout",
    "saliency_map",
    "saliency_maps",
    "talking_heads",
    "TalkingHeads",
    "token_patching",
    "TokenPatching",
]
