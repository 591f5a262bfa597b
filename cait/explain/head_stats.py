"""Per-head statistics researchers cite: how spread out each class-attention head's map is (entropy, as in
DINO's and attention-rollout's head comparisons) and how far each self-attention head looks (the ViT paper's
mean attention distance by depth).

    entropy = attention_entropy(torch.from_numpy(ca_maps))          # [CA layers, heads], nats
    distance = mean_attention_distances(model, x)                   # [B, SA layers, heads], pixels
"""

from __future__ import annotations

import torch

# SA attention a batch may keep of every layer at once (a 48-layer, 16-head, 784-token model holds 3.8 GB of
# maps an image): above it, the maps are reduced to distances layer by layer as the pass runs (`distance_reduce`)
DISTANCE_BYTES = 256 * 2**20


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


def sa_map_bytes(cfg, images: int, layers: int) -> int:
    """Bytes the SA attention maps of `layers` layers take for `images` images in one
    `forward_insights` pass (both stages kept, fp32 at most)."""
    return images * layers * cfg.num_heads * cfg.grid_size**4 * 4 * 2


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
    return {s: torch.stack([ins.self_attention[i][k] for i in range(depth)], dim=1) for k, s in enumerate(stages)}


def attention_distances_of(ins, layers: tuple[int, ...], cfg, *, stage: str = "after_proj_w") -> list[torch.Tensor]:
    """The mean attention distance [B, heads] of each of `layers` from a `forward_insights` pass that kept
    their SA attention (`sa_layers`), at `stage` (one of DISTANCE_STAGES); cfg: the model's config."""
    if stage not in DISTANCE_STAGES:
        raise ValueError(f"stage must be one of {', '.join(DISTANCE_STAGES)}, got {stage!r}")
    return [_distance(ins.self_attention[i][DISTANCE_STAGES.index(stage)], cfg) for i in layers]


def uniform_attention_distance(grid: int, patch_size: int) -> float:
    """The mean attention distance (pixels) of uniform attention over a grid x grid image: the level a head
    that looks nowhere in particular sits at."""
    return float(patch_distances(grid, patch_size).mean())


__all__ = [
    "DISTANCE_BYTES",
    "DISTANCE_STAGES",
    "attention_distances_by_stage",
    "attention_entropy",
    "distance_reduce",
    "mean_attention_distance",
    "attention_distances_of",
    "mean_attention_distances",
    "patch_distances",
    "sa_map_bytes",
    "uniform_attention_distance",
]
