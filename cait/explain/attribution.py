"""Input attributions through captum, per pixel and summed per patch.

Baselines are 0 in normalised space, i.e. an image at the dataset mean colour (a flat grey field).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .attention import _check_input, input_gradients
from .metrics import images_per_pass, perturbed_logits, split_precision_logits

CAPTUM_METHODS = ("integrated_gradients", "saliency", "smoothgrad", "occlusion")


@dataclass(frozen=True)
class MethodOptions:
    """The settings of the explanation methods that have any. Every method of `cait.explain.METHODS`
    takes the whole set and reads what concerns it, so callers never special-case a method."""
    ig_steps: int = 32               # integrated gradients: Gauss-Legendre steps from the baseline
    smoothgrad_samples: int = 16     # smoothgrad: noisy copies whose saliency is averaged
    smoothgrad_stdev: float = 0.15   # smoothgrad: noise standard deviation, in normalised units
    # occlusion (forward passes only): autocast dtype of its passes (None: fp32), used only where a sample
    # of its patches agrees with fp32 (`occlusion_precision`); the gradient methods always run in fp32
    forward_dtype: torch.dtype | None = None

    def captum_kwargs(self, method: str) -> dict[str, Any]:
        """The keyword arguments of `attribution` for `method` that these options set."""
        if method == "integrated_gradients":
            return {"n_steps": self.ig_steps}
        if method == "smoothgrad":
            return {"nt_samples": self.smoothgrad_samples, "stdevs": self.smoothgrad_stdev}
        return {}


DEFAULT_OPTIONS = MethodOptions()


@dataclass
class Attribution:
    pixel: torch.Tensor  # [B, H, W] importance per pixel (see `attribution` for the channel reduction)
    patch: torch.Tensor  # [B, g, g] pixel map summed over each patch
    raw: torch.Tensor    # [B, C, H, W] captum's signed attribution, e.g. for IG's completeness check


def patch_sum(pixel: torch.Tensor, patch_size: int) -> torch.Tensor:
    """[B, H, W] -> [B, H/p, W/p]: total of each non-overlapping p x p patch."""
    B, H, W = pixel.shape
    p = patch_size
    return pixel.reshape(B, H // p, p, W // p, p).sum(dim=(2, 4))


def _copies_per_pass(batch: int, copies: int, num_patches: int) -> int:
    # How many of a method's `copies` of the batch (IG steps, SmoothGrad samples) go through one
    # forward/backward pass. Activations saved for the backward grow with tokens^2 (attention): bound
    # the tokens per pass so a 224 px model stays near a GB, while small models do all in one pass.
    return max(1, min(copies, 4096 // num_patches // batch))


def attribution(model: nn.Module, x: torch.Tensor, target: torch.Tensor, method: str, *,
                forward_dtype: torch.dtype | None = None, **kw: Any) -> Attribution:
    """captum attribution of the target logits to the input, for `method` in CAPTUM_METHODS.

    integrated_gradients: n_steps (default `MethodOptions.ig_steps`) Gauss-Legendre steps from the zero
        baseline, many steps per pass (internal_batch_size: by default as many images as fit 4096 tokens,
        at least B, at most B*n_steps).
    saliency: |d logit / d x|.
    smoothgrad: NoiseTunnel(Saliency), nt_samples noisy copies with stdevs (normalised units; defaults in
        `MethodOptions`), batched like IG's steps (nt_samples_batch_size).
    occlusion: patch-aligned windows (C, p, p) with stride p replaced by the baseline; the value is the
        drop of the target logit, so it keeps its sign (a patch whose removal helps the class is < 0).
        forward_dtype (e.g. bf16): its passes in that autocast, CaiT's class stage and head in fp32, when
        `occlusion_precision` finds that this agrees with fp32 on a sample of patches; fp32 otherwise.
    The gradient methods' pixel map is |attribution| summed over channels.
    Extra keyword arguments go to captum's `attribute` (e.g. n_steps, internal_batch_size, stdevs).
    """
    from captum.attr import IntegratedGradients, NoiseTunnel, Occlusion, Saliency

    _check_input(model, x)
    if method not in CAPTUM_METHODS:
        raise ValueError(f"unknown attribution method {method!r}; choose from {', '.join(CAPTUM_METHODS)}")
    B, C = x.shape[:2]
    p = model.cfg.patch_size
    with input_gradients(model):
        x = x.detach().clone().requires_grad_(method != "occlusion")  # captum would set it, with a warning
        target = target.to(x.device).long().clone()  # clones: the caller may be in inference_mode
        kw = {**DEFAULT_OPTIONS.captum_kwargs(method), **kw}
        if method == "integrated_gradients":
            n_steps = kw.pop("n_steps")
            kw.setdefault("internal_batch_size", B * _copies_per_pass(B, n_steps, model.cfg.num_patches))
            raw = IntegratedGradients(model).attribute(x, baselines=torch.zeros_like(x), target=target,
                                                       n_steps=n_steps, **kw)
        elif method == "saliency":
            raw = Saliency(model).attribute(x, target=target, abs=True, **kw)
        elif method == "smoothgrad":
            kw.setdefault("nt_samples_batch_size", _copies_per_pass(B, kw["nt_samples"], model.cfg.num_patches))
            raw = NoiseTunnel(Saliency(model)).attribute(x, nt_type="smoothgrad", target=target, abs=True, **kw)
        else:
            # a few occluded images per forward pass, as the other perturbation method; no gradients needed
            kw.setdefault("perturbations_per_eval", max(1, images_per_pass(model) // B))
            with torch.no_grad():
                dtype = occlusion_precision(model, x, target, forward_dtype)
                raw = Occlusion(lambda images: split_precision_logits(model, images, dtype)).attribute(
                    x, sliding_window_shapes=(C, p, p), strides=(C, p, p), baselines=0.0, target=target, **kw)
    raw = raw.detach()
    pixel = raw.mean(dim=1) if method == "occlusion" else raw.abs().sum(dim=1)
    return Attribution(pixel=pixel, patch=patch_sum(pixel, p), raw=raw)


# Occlusion in bf16 is checked against fp32 on a sample of patches before it is used. Measured (relative L1
# of whole 196- and 64-patch maps, bf16 trunk, fp32 class stage and head): 1.4-6% on the shipped model's
# scenes, 41-47% on cait_xxs24_224 with random weights, whose logit drops (~5e-5) sit at bf16's rounding.
OCCLUSION_SAMPLE = 7         # patches occluded in both precisions (7 + the intact image: one pass of 8 at 224 px)
OCCLUSION_TOLERANCE = 0.15   # largest relative L1 of the sample's logit drops for bf16 to be used


def occlusion_logit_drops(model: nn.Module, x: torch.Tensor, target: torch.Tensor, patches: torch.Tensor,
                          dtype: torch.dtype | None = None) -> torch.Tensor:
    """[B, k] drop of the target logit when each patch of `patches` (k flat grid indices) alone is set
    to 0, computed directly (`perturbed_logits` in `dtype`; None: fp32)."""
    B, g, p = x.shape[0], model.cfg.grid_size, model.cfg.patch_size
    hidden = x[:, None].repeat(1, len(patches) + 1, 1, 1, 1)  # index 0 stays intact
    for j, patch in enumerate(patches.tolist(), start=1):
        r, c = divmod(patch, g)
        hidden[:, j, :, r * p:(r + 1) * p, c * p:(c + 1) * p] = 0
    logits = perturbed_logits(model, hidden, forward_dtype=dtype)
    scores = logits.gather(2, target.view(B, 1, 1).expand(B, len(patches) + 1, 1))[..., 0]
    return scores[:, :1] - scores[:, 1:]


def occlusion_precision(model: nn.Module, x: torch.Tensor, target: torch.Tensor, dtype: torch.dtype | None, *,
                        tolerance: float | None = None) -> torch.dtype | None:
    """`dtype` when occlusion in it agrees with fp32 on OCCLUSION_SAMPLE patches spread over the grid
    (relative L1 of the logit drops <= tolerance, default OCCLUSION_TOLERANCE, for every image), else
    None (fp32)."""
    if dtype is None:
        return None
    tolerance = OCCLUSION_TOLERANCE if tolerance is None else tolerance
    n = model.cfg.num_patches
    patches = torch.linspace(0, n - 1, min(n, OCCLUSION_SAMPLE)).round().long()
    exact = occlusion_logit_drops(model, x, target, patches)
    fast = occlusion_logit_drops(model, x, target, patches, dtype)
    error = (fast - exact).abs().sum(dim=1) / exact.abs().sum(dim=1).clamp_min(1e-30)
    return dtype if bool((error <= tolerance).all()) else None
