"""How good is a heat map: localization against boxes, and faithfulness by deleting / inserting patches."""

from __future__ import annotations

import torch
from torch import nn

from ..runtime import autocast
from ._checks import ExplainInputError, check_input, check_target
from .maps import size_pair


def _patch_edges(g: int, img_size: int | tuple[int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    H, W = size_pair(img_size)
    steps = torch.arange(g + 1, device=device, dtype=torch.float32)
    return steps * W / g, steps * H / g  # x edges, y edges


def pointing_game(heat: torch.Tensor, boxes: torch.Tensor, img_size: int | tuple[int, int]) -> torch.Tensor:
    """Hit [B] when the centre of the highest patch lies inside the box (edges included).

    Ties are broken uniformly at random (fixed seed), so a constant map scores the chance level (the
    share of patch centres inside the box) rather than always pointing at the top-left patch.

    Args:
        heat: maps [B, g, g].
        boxes: [B, 4] (x0, y0, x1, y1) in input pixels.
        img_size: the input's side (or (H, W)).

    Returns:
        Hits [B] (1.0 or 0.0).
    """
    B, g, _ = heat.shape
    flat = heat.detach().flatten(1).float()
    top = flat == flat.max(dim=1, keepdim=True).values
    noise = torch.rand(flat.shape, generator=torch.Generator().manual_seed(0)).to(flat.device)
    best = torch.where(top, noise, -1.0).argmax(dim=1)
    xs, ys = _patch_edges(g, img_size, heat.device)
    cx, cy = (xs[:-1] + xs[1:])[best % g] / 2, (ys[:-1] + ys[1:])[best // g] / 2
    boxes = boxes.to(heat.device).float()
    return (cx >= boxes[:, 0]) & (cx <= boxes[:, 2]) & (cy >= boxes[:, 1]) & (cy <= boxes[:, 3])


def mass_in_box(heat: torch.Tensor, boxes: torch.Tensor, img_size: int | tuple[int, int]) -> torch.Tensor:
    """Share [B] of the map's positive mass inside the box, each patch's mass spread evenly over its
    pixels (exact partial-patch overlap, no resampling). A uniform map scores box area / image area.

    Args:
        heat: maps [B, g, g].
        boxes: [B, 4] (x0, y0, x1, y1) in input pixels.
        img_size: the input's side (or (H, W)).

    Returns:
        The share of each map's positive mass inside its box [B].
    """
    B, g, _ = heat.shape
    mass = heat.detach().clamp_min(0).float()
    xs, ys = _patch_edges(g, img_size, heat.device)
    boxes = boxes.to(heat.device).float()

    def overlap(edges: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        # fraction [B, g] of each patch interval [e_i, e_i+1] covered by [lo, hi]
        inter = torch.minimum(edges[1:], hi[:, None]) - torch.maximum(edges[:-1], lo[:, None])
        return inter.clamp_min(0) / (edges[1:] - edges[:-1])

    fx, fy = overlap(xs, boxes[:, 0], boxes[:, 2]), overlap(ys, boxes[:, 1], boxes[:, 3])
    inside = (mass * fy[:, :, None] * fx[:, None, :]).sum(dim=(1, 2))
    return inside / mass.sum(dim=(1, 2)).clamp_min(1e-12)


def box_share(boxes: torch.Tensor, img_size: int) -> torch.Tensor:
    """Each box's share [B] of the image's area (boxes [B, 4] in input pixels; NaN for a NaN box): the chance
    level of the pointing game (the top patch at a random place) and of the mass in the box (a uniform map).
    The one owner of the chance row of `cait.evaluate` and the chance level of `cait.atlas`."""
    boxes = boxes.float()
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / img_size**2


def head_row(layer: int, head: int) -> str:
    """The name of CA layer `layer`'s head `head` (both 0-based indices) in tables and files: ca<layer+1>_head<head+1>,
    numbered from 1 as the app and the figures do."""
    return f"ca{layer + 1}_head{head + 1}"


def head_localization(maps: torch.Tensor, boxes: torch.Tensor, img_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pointing hit, mass in box) [B, L, H] of every head's map, maps [B, L, H, g, g] against boxes [B, 4];
    NaN for images without a box (a NaN row). The one owner of the per-head localisation that `cait.atlas`
    writes per image and `cait.evaluate` sums per row (ca<l>_head<h>), so both give the same numbers, ties
    of the pointing game included."""
    B, L, H = maps.shape[:3]
    boxes = boxes.to(maps.device).float()
    flat = boxes.repeat_interleave(L * H, dim=0).nan_to_num(0.0)
    missing = boxes.isnan().any(-1)[:, None, None]
    heat = maps.flatten(0, 2)
    scores = (pointing_game(heat, flat, img_size), mass_in_box(heat, flat, img_size))
    return tuple(s.float().view(B, L, H).masked_fill(missing, float("nan")) for s in scores)


# Tokens per forward pass of the forward-only perturbation methods (deletion/insertion, occlusion): small
# batches stay in cache and run faster per image on a CPU (benchmarks/README.md).
TOKENS_PER_PASS = 1600


def images_per_pass(model: nn.Module) -> int:
    """Images per forward pass of a perturbation method for `model` (8 at 224 px, 25 at 64 px)."""
    return max(1, TOKENS_PER_PASS // (model.cfg.num_patches + 1))


def split_precision_logits(model: nn.Module, x: torch.Tensor, forward_dtype: torch.dtype | None) -> torch.Tensor:
    """fp32 logits of images x: CaiT's SA stage in `forward_dtype` autocast (None: fp32), its class stage and
    head in fp32. Why: the class stage is cheap (one token), and rounding there to bf16's 8 significant bits
    would swamp the small logit differences a perturbation method measures."""
    with autocast(forward_dtype, x.device):
        tokens = model.forward_self_attention(x)
    with autocast(None, x.device):  # off, also inside a caller's autocast
        return model.forward_head(model.forward_class_attention(tokens.float()))


@torch.no_grad()
def _target_probabilities(
    model: nn.Module,
    images: torch.Tensor,
    target: torch.Tensor,
    batch_size: int | None,
    forward_dtype: torch.dtype | None,
) -> torch.Tensor:
    """Softmax probability of target [B] for images [B, k, C, H, W] (perturbed copies of B images) -> [B, k],
    batch_size images per pass (default `images_per_pass`), by `split_precision_logits` in `forward_dtype`."""
    B, k = images.shape[:2]
    if k == 0:
        return images.new_zeros(B, 0)
    chunks = images.flatten(0, 1).split(batch_size or images_per_pass(model))
    logits = torch.cat([split_precision_logits(model, chunk, forward_dtype) for chunk in chunks])
    probs = logits.reshape(B, k, -1).softmax(dim=-1)
    return probs.gather(2, target.view(B, 1, 1).expand(B, k, 1)).squeeze(2)


@torch.no_grad()
def endpoint_probabilities(
    model: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    *,
    baseline: float = 0.0,
    forward_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """[B, 2]: the target's probability on the intact image and on the image wholly replaced by `baseline`,
    the two ends every deletion/insertion curve shares whatever the map (give them to several
    `deletion_insertion` calls on the same images to score them once).

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).
        target: the class explained per image, LongTensor [B] (or one int for all).
        baseline, forward_dtype: as `deletion_insertion`'s.

    Returns:
        [B, 2]: the target's probability on x and on the all-baseline image.
    """
    check_input(model, x)
    target = check_target(model, target, x.shape[0], x.device)
    images = torch.stack((x, torch.full_like(x, baseline)), dim=1)
    return _target_probabilities(model, images, target, None, forward_dtype)


@torch.no_grad()
def deletion_insertion(
    model: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    heat: torch.Tensor,
    steps: int | None = None,
    *,
    baseline: float = 0.0,
    batch_size: int | None = None,
    forward_dtype: torch.dtype | None = None,
    endpoints: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Deletion and insertion curves (Petsiuk et al. 2018) on whole patches, with their AUC.

    Patches are ranked by `heat` (highest first). At step i of `steps` (default: one patch per step,
    at most 32 steps) the top round(i * N / steps) patches are replaced by `baseline` (deletion; 0 is
    the dataset mean in normalised space) or are the only ones kept from x (insertion), and the
    softmax probability of `target` is recorded. Curves are [B, steps + 1] from 0 to all patches; the
    AUC is the trapezoid area over the fraction of patches in [0, 1]. Low deletion AUC and high
    insertion AUC mean a faithful ranking. The perturbed images are evaluated in batches of batch_size
    (default `images_per_pass`: small batches, measured faster per image on a CPU than large ones), in
    `forward_dtype` autocast with the class stage and head in fp32 (None: fp32). The curves' two ends
    (intact image, all baseline) do not depend on the map: `endpoints` (`endpoint_probabilities`) gives
    them, computed here when None.

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).
        target: the class explained per image, LongTensor [B] (or one int for all).
        heat: the maps ranking the patches [B, g, g].
        steps, baseline, batch_size, forward_dtype, endpoints: as above.

    Returns:
        deletion and insertion curves [B, steps + 1] and their AUCs [B].
    """
    check_input(model, x)
    target = check_target(model, target, x.shape[0], x.device)
    B, C, H, W = x.shape
    g = model.cfg.grid_size
    if tuple(heat.shape) != (B, g, g):
        raise ExplainInputError(
            f"heat must be [B, g, g] = [{B}, {g}, {g}] (the model's patch grid), got {list(heat.shape)}"
        )
    n = g * g
    p = model.cfg.patch_size
    steps = steps or min(n, 32)
    if not 1 <= steps <= n:
        raise ExplainInputError(f"steps must be in 1..{n} (number of patches), got {steps}")
    if endpoints is None:
        endpoints = endpoint_probabilities(model, x, target, baseline=baseline, forward_dtype=forward_dtype)
    intact, replaced = endpoints[:, :1].float(), endpoints[:, 1:].float()
    order = heat.detach().flatten(1).argsort(dim=1, descending=True).to(x.device)
    ranks = torch.empty_like(order).scatter_(1, order, torch.arange(n, device=x.device).expand(B, -1))
    counts = torch.round(torch.arange(steps + 1, device=x.device) * n / steps)  # patches hidden per step
    hidden = ranks[:, None, :] < counts[None, 1:-1, None]  # [B, S-1, N]: the inner steps
    pixels = hidden.reshape(B, steps - 1, 1, g, g).repeat_interleave(p, 3).repeat_interleave(p, 4)

    def inner(keep_original: torch.Tensor) -> torch.Tensor:
        images = torch.where(keep_original, x[:, None], torch.full_like(x[:, None], baseline))
        return _target_probabilities(model, images, target, batch_size, forward_dtype)

    deletion = torch.cat((intact, inner(~pixels), replaced), dim=1)
    insertion = torch.cat((replaced, inner(pixels), intact), dim=1)
    fraction = counts / n
    auc = lambda c: torch.trapezoid(c, fraction.to(c.dtype), dim=1)
    return dict(deletion=deletion, insertion=insertion, deletion_auc=auc(deletion), insertion_auc=auc(insertion))
