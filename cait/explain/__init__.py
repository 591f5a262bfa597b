"""Every explanation of a CaiT prediction that the app, `cait.evaluate` and the analysis scripts show.

All functions take a normalised batch x [B, C, H, W] and a model from `cait.create_model`; heat maps
are on the patch grid [B, g, g] (higher = more important), boxes are [B, 4] (x0, y0, x1, y1) in input
pixels. `METHODS[name](model, x, target, options)` runs any method by name (target: LongTensor [B];
options: `MethodOptions`, optional), `saliency_map` does the same with the name checked.
What matters rather than where the model looks (`causal`): direct logit attribution of every CA head
and patch, knockout profiles of whole blocks, head ablations; how the answer forms (`mechanisms`): the
logit lens through the class-attention stage, activation patching between a clean and a corrupted image, and
per patch region into the class stage (`token_patching`).
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
from .attribution import CAPTUM_METHODS, IG_BASELINES, Attribution, MethodOptions, attribution, ig_baseline, patch_sum
from .causal import (
    HeadAblation,
    LogitAttribution,
    all_head_ablations,
    block_gamma_mean_abs,
    block_names,
    direct_logit_attribution,
    head_ablation,
    knockout_profile,
    mean_head_outputs,
    predicted_attribution,
    recorded_sa_inputs,
)
from .head_stats import (
    DISTANCE_STAGES,
    attention_distances_by_stage,
    attention_entropy,
    distance_reduce,
    kept_distances,
    mean_attention_distance,
    mean_attention_distances,
    patch_distances,
    uniform_attention_distance,
)
from .layerscale import layerscale_stats, layerscale_stats_from_metrics
from .maps import DEFAULT_SHARE, mask_to_boxes, overlay, overlays, regions_of_focus, upsample
from .mechanisms import GRANULARITIES, Patching, activation_patching, answer_forms_at, logit_lens
from .methods import METHODS, Method, saliency_map, saliency_maps
from .metrics import (
    deletion_insertion,
    endpoint_probabilities,
    head_localization,
    head_row,
    mass_in_box,
    pointing_game,
)
from .token_patching import (
    DIRECTIONS,
    TokenPatching,
    TokenPatchingError,
    class_stage_patched,
    region_boxes,
    region_masks,
    token_patching,
)

__all__ = [
    "activation_patching",
    "answer_forms_at",
    "all_head_ablations",
    "attention_distances_by_stage",
    "attention_entropy",
    "distance_reduce",
    "kept_distances",
    "attribution",
    "Attribution",
    "block_gamma_mean_abs",
    "block_names",
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
    "head_row",
    "HEAD_FUSIONS",
    "HeadAblation",
    "ig_baseline",
    "IG_BASELINES",
    "knockout_profile",
    "layerscale_stats",
    "layerscale_stats_from_metrics",
    "logit_lens",
    "LogitAttribution",
    "mask_to_boxes",
    "mass_in_box",
    "mean_attention_distance",
    "mean_attention_distances",
    "mean_head_outputs",
    "Method",
    "MethodOptions",
    "METHODS",
    "mixing_matrices",
    "overlay",
    "overlays",
    "patch_distances",
    "patch_sum",
    "Patching",
    "predicted_attribution",
    "pointing_game",
    "recorded_sa_inputs",
    "region_boxes",
    "region_masks",
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
