"""Explanations of a CaiT prediction: where the model looks and what matters for its answer.

Every function takes a model from `cait.load_model` and a normalised batch x [B, C, H, W]
(`cait.preprocess.normalise`), and, where it explains a class, target [B] (class indices; one int for every
image); each checks them at the door and raises `cait.InputError` naming the argument. Heat maps are on the
patch grid [B, g, g] (higher = more important); layers, heads and blocks are indexed from 0.

- where it looks: `class_attention`, `class_specific_attention`, `rollout`/`rollouts`, `gradient_rollout`,
  `talking_heads`, captum's methods through `attribution`; any of them by name: `saliency_map(s)`, `METHODS`
- what matters: `direct_logit_attribution`, `knockout_profile`, `head_ablation`/`all_head_ablations`
- how the answer forms: `logit_lens`, `activation_patching`, `token_patching` (per patch region into the
  class stage; `region_sums` sets a patch map beside its regions)
- how good a map is: `pointing_game`, `mass_in_box`, `deletion_insertion`, `head_localization`
- the paper's statistics: attention distances, entropy, LayerScale
"""

from __future__ import annotations

from .attention import (
    HEAD_FUSIONS,
    ROLLOUT_STAGES,
    ClassAttention,
    TalkingHeads,
    class_attention,
    class_specific_attention,
    gradient_rollout,
    mixing_matrices,
    rollout,
    rollouts,
    talking_heads,
)
from .attribution import (
    CAPTUM_METHODS,
    IG_BASELINES,
    Attribution,
    MethodOptions,
    Option,
    attribution,
    checked_options,
    ig_baseline,
    method_options,
)
from .causal import (
    HeadAblation,
    LogitAttribution,
    all_head_ablations,
    block_gamma_mean_abs,
    direct_logit_attribution,
    head_ablation,
    knockout_profile,
)
from .head_stats import (
    DISTANCE_STAGES,
    attention_distances_by_stage,
    attention_entropy,
    mean_attention_distance,
    mean_attention_distances,
    uniform_attention_distance,
)
from .layerscale import layerscale_stats, layerscale_stats_from_metrics
from .maps import DEFAULT_SHARE, overlay, overlays, regions_of_focus, upsample
from .mechanisms import GRANULARITIES, Patching, activation_patching, answer_forms_at, logit_lens
from .methods import METHODS, Method, ca_mean_layer, ca_mean_methods, saliency_map, saliency_maps
from .metrics import deletion_insertion, endpoint_probabilities, head_localization, mass_in_box, pointing_game
from .token_patching import (
    DIRECTIONS,
    TokenPatching,
    TokenPatchingError,
    class_stage_patched,
    region_boxes,
    region_masks,
    region_sums,
    token_patching,
)

__all__ = [
    "activation_patching",
    "all_head_ablations",
    "answer_forms_at",
    "attention_distances_by_stage",
    "attention_entropy",
    "attribution",
    "Attribution",
    "block_gamma_mean_abs",
    "CAPTUM_METHODS",
    "class_attention",
    "class_specific_attention",
    "class_stage_patched",
    "ClassAttention",
    "DEFAULT_SHARE",
    "deletion_insertion",
    "direct_logit_attribution",
    "DIRECTIONS",
    "DISTANCE_STAGES",
    "endpoint_probabilities",
    "gradient_rollout",
    "GRANULARITIES",
    "head_ablation",
    "head_localization",
    "HEAD_FUSIONS",
    "HeadAblation",
    "ig_baseline",
    "IG_BASELINES",
    "knockout_profile",
    "layerscale_stats",
    "layerscale_stats_from_metrics",
    "logit_lens",
    "LogitAttribution",
    "mass_in_box",
    "mean_attention_distance",
    "mean_attention_distances",
    "Method",
    "MethodOptions",
    "Option",
    "checked_options",
    "method_options",
    "METHODS",
    "ca_mean_layer",
    "ca_mean_methods",
    "mixing_matrices",
    "overlay",
    "overlays",
    "Patching",
    "pointing_game",
    "region_boxes",
    "region_masks",
    "region_sums",
    "regions_of_focus",
    "rollout",
    "ROLLOUT_STAGES",
    "rollouts",
    "saliency_map",
    "saliency_maps",
    "talking_heads",
    "TalkingHeads",
    "token_patching",
    "TokenPatching",
    "TokenPatchingError",
    "uniform_attention_distance",
    "upsample",
]
