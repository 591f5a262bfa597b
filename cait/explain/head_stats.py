"""Per-head statistics researchers cite: how spread out each class-attention head's map is (entropy, as in
DINO's and attention-rollout's head comparisons) and how far each self-attention head looks (the ViT paper's
mean attention distance by depth).

    entropy = attention_entropy(torch.from_numpy(ca_maps))          # [CA layers, heads], nats
    distance = mean_attention_distances(model, x)                   # [B, SA layers, heads], pixels
"""

from __future__ import annotations

import math

import torch


def attention_entropy(maps: torch.Tensor, *, dims: int = 2) -> torch.Tensor:
    """Entropy in nats of each map over its last `dims` dimensions (2: a [..., g, g] patch grid) of
    non-negative weights, each renormalised to sum 1 first (a class-attention map leaves out the class token's
    share for itself). 0 for all mass on one patch, ln(N) for uniform attention; returns maps.shape[:-dims]."""
    p = maps.float().clamp_min(0).flatten(-dims)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
    return -(p * p.clamp_min(1e-30).log()).sum(-1)


def patch_distances(grid: int, patch_size: int) -> torch.Tensor:
    """Euclidean distance in input pixels between the centres of every two patches of a grid x grid
    image, [N, N] in row-major patch order."""
    rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    centres = torch.stack([rows.flatten(), cols.flatten()], -1).float() * patch_size
    return torch.cdist(centres, centres)


def mean_attention_distance(attn: torch.Tensor, *, patch_size: int) -> torch.Tensor:
    """The ViT paper's mean attention distance: for each query patch, the attention-weighted distance in
    pixels to the key patches, averaged over queries. attn [..., N, N] (query, key) over a square grid;
    returns [...]. The weights are taken in absolute value and renormalised per query: after talking heads'
    proj_w they can be negative and need not sum to 1 (for softmax weights this is the paper's definition)."""
    n = attn.shape[-1]
    grid = int(round(n**0.5))
    if grid * grid != n or attn.shape[-2] != n:
        raise ValueError(f"attn must be [..., N, N] over a square patch grid, got shape {list(attn.shape)}")
    w = attn.float().abs()
    w = w / w.sum(-1, keepdim=True).clamp_min(1e-12)
    d = patch_distances(grid, patch_size).to(w.device)
    return (w * d).sum(-1).mean(-1)


DISTANCE_STAGES = ("after_proj_l", "after_proj_w")  # the SA weights a distance can be read from, in model order


def mean_attention_distances(model, x: torch.Tensor, *, stage: str = "after_proj_w") -> torch.Tensor:
    """Each SA layer's heads' mean attention distance (pixels) at `stage`, [B, SA layers, heads]: after proj_w
    (the default), the weights that multiply the values; after proj_l, the softmax (a true distribution).
    One `model.forward_insights` pass. Call under torch.inference_mode (and autocast, if wanted)."""
    return attention_distances_by_stage(model, x, stages=(stage,))[stage]


def distance_reduce(cfg, stages: tuple[str, ...] = DISTANCE_STAGES):
    """A `forward_insights` sa_reduce that keeps, per SA layer, only the mean attention distance [B, heads] at
    each of `stages` (one of DISTANCE_STAGES each): every layer's distances from one pass, whatever the depth,
    while the maps themselves would not fit (cfg: the model's config)."""
    for stage in stages:
        if stage not in DISTANCE_STAGES:
            raise ValueError(f"stage must be one of {', '.join(DISTANCE_STAGES)}, got {stage!r}")

    def reduce(*maps: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(_distance(maps[DISTANCE_STAGES.index(stage)], cfg) for stage in stages)

    return reduce


def _distance(weights: torch.Tensor, cfg) -> torch.Tensor:
    if weights.shape[-1] == cfg.grid_size**2 + 1:  # an ablation's class token among the SA tokens: patches only
        weights = weights[..., 1:, 1:]
    return mean_attention_distance(weights, patch_size=cfg.patch_size)


def attention_distances_by_stage(
    model, x: torch.Tensor, *, stages: tuple[str, ...] = DISTANCE_STAGES
) -> dict[str, torch.Tensor]:
    """`mean_attention_distances` at each of `stages` from one pass: stage -> [B, SA layers, heads]."""
    depth = model.cfg.depth
    ins = model.forward_insights(x, sa_layers=tuple(range(depth)), sa_reduce=distance_reduce(model.cfg, stages))
    return kept_distances(ins, stages)


def kept_distances(ins, stages: tuple[str, ...] = DISTANCE_STAGES) -> dict[str, torch.Tensor]:
    """What a pass with sa_reduce=`distance_reduce(cfg, stages)` kept: stage -> [B, SA layers, heads]."""
    layers = sorted(ins.self_attention)
    return {s: torch.stack([ins.self_attention[i][k] for i in layers], dim=1) for k, s in enumerate(stages)}


def uniform_attention_distance(grid: int, patch_size: int) -> float:
    """The mean attention distance (pixels) of uniform attention over a grid x grid image: the level a head
    that looks nowhere in particular sits at. Summed exactly (math.fsum) in float64, so the value does not
    depend on how many threads torch splits a reduction over: one process and torchrun's ranks agree."""
    rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    centres = torch.stack([rows.flatten(), cols.flatten()], -1).double() * patch_size
    distances = (centres[:, None] - centres[None]).pow(2).sum(-1).sqrt()  # elementwise: no thread-split sums
    return math.fsum(distances.flatten().tolist()) / distances.numel()


__all__ = [
    "DISTANCE_STAGES",
    "attention_distances_by_stage",
    "attention_entropy",
    "distance_reduce",
    "kept_distances",
    "mean_attention_distance",
    "mean_attention_distances",
    "patch_distances",
    "uniform_attention_distance",
]
