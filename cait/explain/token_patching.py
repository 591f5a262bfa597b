"""Token patching into the class stage: where, over the image, the answer travels into CaiT's class token.

The class token reads the image only in the class-attention (CA) stage, from the patch tokens the SA stage
leaves; the CA stage never changes them. So one region of those tokens taken from a clean run into a corrupted
one (every other token stays corrupted), with only the CA stage, final norm and head re-run, measures how much
of the clean-corrupted logit gap that region carries into the class token; the reverse (one region of the
clean run corrupted) measures how much the answer loses without it. Each image costs one forward of each run,
which keeps every CA block's keys and values of the patch tokens (LayerNorm and the projections act per
token, so these are fixed per run), then per region and direction only the class token's own path on rows of
those keys and values (`_stage.class_token_logits`), the regions batched: about two forwards in all.
Regions are squares of `region` x `region` patches in row-major order (the last row and column of regions are
smaller when `region` does not divide the grid); maps are [B, R, R] with R = ceil(grid / region).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from ..config import CaiTConfig
from ..errors import InputError, shown
from ._checks import check_class_stage, check_input, check_target
from ._stage import ClassStageKeys, class_stage_keys, class_token_logits, evaluating, target_difference

Direction = Literal["both", "restore", "break"]
DIRECTIONS = ("both", "restore", "break")
CHUNK_VALUES = 1 << 24  # attention or MLP values per batch of patched runs (64 MB in fp32): bounds many regions' memory


class TokenPatchingError(InputError):
    """Token patching asked of inputs that cannot work (shapes, region size, direction, a model without a
    CA stage); the message is one line."""


def region_bounds(grid: int) -> tuple[int, int]:
    """The region sides one may ask of a patch grid of side `grid`, inclusive: 1 (each patch its own region)
    to `grid` (one region, the whole stage). A page's slider spans these; `checked_region` refuses the rest."""
    return 1, grid


def checked_region(value: Any, grid: int, *, name: str = "region") -> int:
    """A region side from a loosely typed value (a web client's number or string) for a patch grid of side
    `grid`.

    Args:
        value: the side in patches (an int, a whole float such as a slider's 2.0, or its text).
        grid: the patch grid's side.
        name: what the caller calls the value, in the message.

    Returns:
        The side as an int within `region_bounds(grid)`; TokenPatchingError in one line naming `name` otherwise.
    """
    low, high = region_bounds(grid)
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not number.is_integer() or not low <= number <= high:  # NaN fails both
        raise TokenPatchingError(f"{name} must be a whole number of patches from {low} to {high}, got {shown(value)}")
    return int(number)


def region_masks(grid: int, region: int) -> torch.Tensor:
    """Which patches each region holds: bool [R * R, grid * grid], regions and patches in row-major order.

    Args:
        grid: the patch grid's side g.
        region: a region's side in patches, within `region_bounds(grid)`.

    Returns:
        One row per region, True at its patches; the rows partition the grid.
    """
    if not isinstance(region, int):
        raise TokenPatchingError(f"region must be a whole number of patches, got {region!r}")
    region = checked_region(region, grid)
    per_side = math.ceil(grid / region)
    cell = torch.arange(grid) // region
    which = (cell[:, None] * per_side + cell[None, :]).flatten()  # each patch's region
    return which[None, :] == torch.arange(per_side * per_side)[:, None]


def region_boxes(grid: int, region: int, patch_size: int) -> torch.Tensor:
    """Each region's extent in input pixels [R * R, 4] (x0, y0, x1, y1), row-major as `region_masks`."""
    per_side = math.ceil(grid / region)
    edges = (torch.arange(per_side + 1) * region).clamp(max=grid).float() * patch_size
    y, x = torch.meshgrid(torch.arange(per_side), torch.arange(per_side), indexing="ij")
    y, x = y.flatten(), x.flatten()
    return torch.stack((edges[x], edges[y], edges[x + 1], edges[y + 1]), dim=1)


def class_stage_patched(
    model: nn.Module, tokens: torch.Tensor, source: torch.Tensor, masks: torch.Tensor
) -> torch.Tensor:
    """Logits of the CA stage, final norm and head reading `tokens` with the patches of each mask taken from
    `source` instead, every mask in one batched run (chunked to bound memory).

    Args:
        model: a CaiT with a class-attention stage (run in eval mode without autograd).
        tokens: the patch tokens after the SA stage [B, N, d] that the class stage reads.
        source: patch tokens of another run [B, N, d], put in where a mask is True.
        masks: bool [M, N], one set of patch positions per row (all False: `tokens` unchanged).

    Returns:
        Logits [B, M, classes].
    """
    with evaluating(model):
        return _patched(model, class_stage_keys(model, tokens), class_stage_keys(model, source), masks)


def _patched(model: nn.Module, base: ClassStageKeys, source: ClassStageKeys, masks: torch.Tensor) -> torch.Tensor:
    """Logits [B, M, K] of the class stage on the run `base` with the patches of each mask ([M, N], or
    [B, M, N] one set per image) read from the run `source`: the class token's own path per mask, on both
    runs' cached keys and values (`class_stage_keys`), in chunks of masks that bound memory."""
    B, heads, N, _ = base.keys[0].shape
    width = max(heads * N, model.cfg.embed_dim * model.cfg.mlp_ratio_token_only)  # values per mask and image
    chunk = max(1, int(CHUNK_VALUES // (B * width)))
    masks = masks.to(base.keys[0].device)
    parts = [class_token_logits(model, base, source=source, swapped=part) for part in masks.split(chunk, dim=-2)]
    return torch.cat(parts, dim=1)


@dataclass
class TokenPatching:
    """Token patching of one target logit per image between a clean and a corrupted run, per region (maps
    [B, R, R], row-major as `region_masks`; None for a direction not asked)."""

    target: torch.Tensor  # [B] the class whose logit is measured
    clean: torch.Tensor  # [B, K] the clean run's logits
    corrupted: torch.Tensor  # [B, K] the corrupted run's logits
    region: int  # a region's side in patches
    grid: int  # the patch grid's side
    restored: torch.Tensor | None  # [B, R, R] corrupted run with the region's clean tokens, minus the corrupted
    broken: torch.Tensor | None  # [B, R, R] the clean run's target logit minus that with the region corrupted
    top: int = 0  # regions patched together in `top_restored`
    top_restored: torch.Tensor | None = None  # [B] the `top` best regions' clean tokens together, minus corrupted

    @property
    def gap(self) -> torch.Tensor:
        """Clean minus corrupted target logit [B]: what patching every region at once restores."""
        return target_difference(self.clean, self.corrupted, self.target)

    def fraction(self, values: torch.Tensor) -> torch.Tensor:
        """`values` ([B, ...] logits, e.g. `restored`) as fractions of each image's gap (NaN where it is 0)."""
        gap = self.gap.view(-1, *([1] * (values.dim() - 1)))
        return values / torch.where(gap == 0, torch.nan, gap)

    def on_patches(self, maps: torch.Tensor) -> torch.Tensor:
        """Region maps [B, R, R] on the patch grid [B, g, g], each patch holding its region's value."""
        cell = torch.arange(self.grid, device=maps.device) // self.region
        return maps[:, cell][:, :, cell]


def _checked(model: nn.Module, clean, corrupted, target, region, direction, top) -> torch.Tensor:
    """The target as LongTensor [B] on the images' device, after every check of `token_patching`'s inputs."""
    try:
        check_input(model, clean, name="clean")
        check_input(model, corrupted, name="corrupted")
        check_class_stage(model)
        target = check_target(model, target, clean.shape[0], clean.device)
    except InputError as e:
        raise TokenPatchingError(str(e)) from None
    if clean.shape[0] != corrupted.shape[0]:
        got = f"got {corrupted.shape[0]} for {clean.shape[0]}"
        raise TokenPatchingError(f"need one corrupted image per clean one, {got}")
    if direction not in DIRECTIONS:
        raise TokenPatchingError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    regions = len(region_masks(model.cfg.grid_size, region))
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= regions:
        raise TokenPatchingError(f"top must be a whole number of regions from 0 to {regions}, got {top!r}")
    if top and direction == "break":
        raise TokenPatchingError("top patches the best regions into the corrupted run: ask direction restore or both")
    return target


def token_patching(
    model: nn.Module,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    target: torch.Tensor,
    *,
    region: int = 1,
    direction: Direction = "both",
    top: int = 0,
) -> TokenPatching:
    """Where the answer enters the class token: for each region of the patch grid, the corrupted run's target
    logit with that region's patch tokens at the CA stage's input taken from the clean run ("restore"), and the
    clean run's with that region's tokens taken from the corrupted run ("break").

    Args:
        model: a CaiT with a class-attention stage and a class-token head.
        clean: the normalised clean images [B, C, H, W].
        corrupted: the normalised corrupted images (or second images) [B, C, H, W], one per clean image.
        target: the class whose logit is measured, per image [B].
        region: a region's side in patches (1: each patch; the grid's side: the whole stage, the clean run).
        direction: "restore", "break" or "both".
        top: with "restore" or "both", also patch the `top` regions that restore most alone together into the
            corrupted run (`top_restored`); 0: not.

    Returns:
        `TokenPatching`: `restored` and `broken` maps [B, R, R] in target logits (over the gap:
        `.fraction(...)`), the gap, both runs' logits and `top_restored`.
    """
    target = _checked(model, clean, corrupted, target, region, direction, top)
    masks = region_masks(model.cfg.grid_size, region)
    per_side = math.isqrt(len(masks))
    with evaluating(model):
        runs = [class_stage_keys(model, model.forward_self_attention(x)) for x in (clean, corrupted)]
        logits = [class_token_logits(model, run)[:, 0] for run in runs]

        def target_logit(base: ClassStageKeys, source: ClassStageKeys, which: torch.Tensor) -> torch.Tensor:
            out = _patched(model, base, source, which)  # [B, M, K]
            return out.gather(2, target.view(-1, 1, 1).expand(-1, out.shape[1], 1))[..., 0]

        base = [out.gather(1, target.view(-1, 1)) for out in logits]  # [B, 1] each
        restored = broken = top_restored = None
        if direction in ("both", "restore"):
            restored = (target_logit(runs[1], runs[0], masks) - base[1]).view(-1, per_side, per_side)
            if top:
                best = restored.flatten(1).topk(top, dim=1).indices  # [B, top]
                together = masks.to(best.device)[best].any(1)  # [B, N]: each image's own set
                top_restored = target_logit(runs[1], runs[0], together[:, None])[:, 0] - base[1][:, 0]
        if direction in ("both", "break"):
            broken = (base[0] - target_logit(runs[0], runs[1], masks)).view(-1, per_side, per_side)
    grid = model.cfg.grid_size
    return TokenPatching(target, logits[0], logits[1], region, grid, restored, broken, top, top_restored)


def token_patching_forwards(model: nn.Module, *, region: int = 1, direction: Direction = "both") -> float:
    """What `token_patching` of one image costs, in forward passes of the model by multiply-accumulates
    (`CaiT.flops`): the clean and the corrupted run (one forward each, the class stage's keys and values of
    the patch tokens kept), then per region and direction the class token's own path on those keys and values
    (`class_token_flops`). A floor: gathering the swapped entries and the softmax cost time no FLOP count sees.

    Args:
        model: a CaiT with a class-attention stage.
        region: a region's side in patches, as `token_patching` takes it.
        direction: "restore", "break" or "both", as `token_patching` takes it.

    Returns:
        Forward passes (a float, at least 2).
    """
    if direction not in DIRECTIONS:
        raise TokenPatchingError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    regions = len(region_masks(model.cfg.grid_size, region))
    directions = 2 if direction == "both" else 1
    return 2 + directions * class_token_flops(model.cfg, regions) / model.flops()


def class_token_flops(cfg: CaiTConfig, runs: int) -> int:
    """Multiply-accumulates of `runs` patched runs of the class stage and head on two runs' cached keys and
    values (`_stage.class_token_logits`), the swapped patches partitioning the grid (each patch swapped in one
    run). The first CA block's class token is the model's own in every run, so its query, key, value, scores
    against the base run and weighted sum of the base values are computed once, each run adding only the swapped
    patches (the others' from the base run, its own from the other run); from then on each run's class token has
    its own.

    Args:
        cfg: the model's config.
        runs: how many patched runs (regions).

    Returns:
        Multiply-accumulates of all of them.
    """
    d, n, depth = cfg.embed_dim, cfg.num_patches, cfg.depth_token_only
    mlp = 2 * d * int(d * cfg.mlp_ratio_token_only)
    shared = 3 * d * d + 2 * n * d + d  # block 1: q, k, v of the class token, its attention over the base run
    first = d * d + mlp  # per run: the projection, the MLP
    later = 4 * d * d + 2 * n * d + d + mlp  # per run and later block: the class token's whole path
    swapped = 2 * n * d * depth  # every block: each swapped patch's score and weighted value, once in all
    return shared + runs * (first + (depth - 1) * later + d * cfg.num_classes) + swapped


def region_sums(maps: torch.Tensor, region: int) -> torch.Tensor:
    """Patch maps (e.g. class attention) summed over each token-patching region, row-major as `region_masks`,
    to set beside `TokenPatching`'s maps.

    Args:
        maps: patch maps [B, g, g].
        region: a region's side in patches, as `token_patching` takes it.

    Returns:
        The sums [B, R, R], in the maps' dtype and on their device.
    """
    grid = maps.shape[-1]
    masks = region_masks(grid, region).to(maps)
    per_side = math.isqrt(len(masks))
    return (maps.flatten(1) @ masks.T).view(-1, per_side, per_side)
