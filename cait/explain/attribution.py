"""Input attributions through captum, per pixel and summed per patch.

Baselines are 0 in normalised space, i.e. an image at the dataset mean colour (a flat grey field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import InputError, shown
from ._checks import ExplainInputError, check_input, check_target
from .attention import input_gradients
from .metrics import images_per_pass

CAPTUM_METHODS = ("integrated_gradients", "saliency", "smoothgrad", "occlusion")


@dataclass(frozen=True)
class MethodOptions:
    """The settings of the explanation methods that have any. Every method of `cait.explain.METHODS`
    takes the whole set and reads what concerns it, so callers never special-case a method."""

    ig_steps: int = 32  # integrated gradients: Gauss-Legendre steps from the baseline
    ig_baseline: str = "mean"  # integrated gradients: the image it starts from, one of IG_BASELINES
    signed: bool = False  # gradient methods: attributions summed over channels with their sign, not |.|
    smoothgrad_samples: int = 16  # smoothgrad: noisy copies whose saliency is averaged
    smoothgrad_stdev: float = 0.15  # smoothgrad: noise standard deviation, in normalised units
    rollout_head_fusion: str = "mean"  # rollout: a layer's heads merged by "mean", "max" or "min"
    rollout_discard_ratio: float = 0.0  # rollout: share of each SA layer's lowest weights set to 0

    def captum_kwargs(self, method: str) -> dict[str, Any]:
        """The keyword arguments of `attribution` for `method` that these options set."""
        signed = {"signed": True} if self.signed and method != "occlusion" else {}  # occlusion: always signed
        if method == "integrated_gradients":
            return {"n_steps": self.ig_steps, "baseline": self.ig_baseline, **signed}
        if method == "smoothgrad":
            return {"nt_samples": self.smoothgrad_samples, "stdevs": self.smoothgrad_stdev, **signed}
        return signed


DEFAULT_OPTIONS = MethodOptions()
# what a caller may ask of each numeric option (inclusive): the app's sliders span these, and /analyze refuses
# anything outside, so that no call holds the model for minutes (IG and SmoothGrad cost grows with the count)
OPTION_BOUNDS: dict[str, tuple[float, float]] = {
    "ig_steps": (4, 128),
    "smoothgrad_samples": (2, 64),
    "smoothgrad_stdev": (0.0, 1.0),
    "rollout_discard_ratio": (0.0, 0.95),
}


class OptionError(InputError):
    """A method option outside `OPTION_BOUNDS` or of the wrong type; the message names it."""


def checked_options(**values: Any) -> MethodOptions:
    """`MethodOptions` from loosely typed values (a web client's numbers and strings), each converted to its
    field's type and checked against `OPTION_BOUNDS`.

    Args:
        values: fields of `MethodOptions` by name; the ones not given keep their defaults.

    Returns:
        The options. Raises OptionError in one line naming the first option that does not fit."""
    kinds = {"ig_steps": int, "smoothgrad_samples": int, "signed": bool, "smoothgrad_stdev": float}
    kinds |= {"rollout_discard_ratio": float, "ig_baseline": str, "rollout_head_fusion": str}
    typed = {}
    for name, value in values.items():
        kind = kinds[name]
        try:
            number = float(value) if kind is int else None
            if number is not None and not number.is_integer():
                raise ValueError
            typed[name] = kind(value) if number is None else int(number)
        except (TypeError, ValueError, OverflowError):
            what = {int: "a whole number", float: "a number"}.get(kind, kind.__name__)
            raise OptionError(f"{name} must be {what}, got {shown(value)}") from None
        low, high = OPTION_BOUNDS.get(name, (None, None))
        if low is not None and not low <= typed[name] <= high:  # NaN fails too
            raise OptionError(f"{name} must be between {low:g} and {high:g}, got {typed[name]:g}")
    return MethodOptions(**typed)


# integrated gradients' baselines, as captum Insights offers them: the normalisation's mean colour (0 in
# normalised units, the usual default), a black image, the image blurred, Gaussian noise
IG_BASELINES = ("mean", "black", "blurred", "noise")


def ig_baseline(x: torch.Tensor, name: str, cfg) -> torch.Tensor:
    """The baseline image `name` (IG_BASELINES) for the normalised batch x [B, C, H, W] of a model with `cfg`."""
    if name == "mean":
        return torch.zeros_like(x)
    if name == "black":
        mean, std = (torch.tensor(v, dtype=x.dtype, device=x.device)[:, None, None] for v in (cfg.mean, cfg.std))
        return (-mean / std).expand_as(x).clone()
    if name == "blurred":
        from torchvision.transforms.functional import gaussian_blur

        side = x.shape[-1] // 8 * 2 + 1  # odd, about a quarter of the image: objects are gone, colours stay
        return gaussian_blur(x, [side, side], [side / 4.0, side / 4.0])
    if name == "noise":
        return torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=x.dtype).to(x.device)
    raise ExplainInputError(f"unknown integrated-gradients baseline {name!r}; choose from {', '.join(IG_BASELINES)}")


@dataclass
class Attribution:
    pixel: torch.Tensor  # [B, H, W] importance per pixel (see `attribution` for the channel reduction)
    patch: torch.Tensor  # [B, g, g] pixel map summed over each patch
    raw: torch.Tensor  # [B, C, H, W] captum's signed attribution, e.g. for IG's completeness check


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


def attribution(model: nn.Module, x: torch.Tensor, target: torch.Tensor, method: str, **kw: Any) -> Attribution:
    """captum attribution of the target logits to the input, for `method` in CAPTUM_METHODS.

    integrated_gradients: n_steps (default `MethodOptions.ig_steps`) Gauss-Legendre steps from the baseline
        (baseline: a name of `IG_BASELINES`, "mean", the zero of normalised units, by default), many steps
        per pass (internal_batch_size: by default as many images as fit 4096 tokens, at least B, at most
        B*n_steps).
    saliency: |d logit / d x|.
    smoothgrad: NoiseTunnel(Saliency), nt_samples noisy copies with stdevs (normalised units; defaults in
        `MethodOptions`), batched like IG's steps (nt_samples_batch_size).
    occlusion: patch-aligned windows (C, p, p) with stride p replaced by the baseline; the value is the
        drop of the target logit, so it keeps its sign (a patch whose removal helps the class is < 0).
        Always fp32: its logit drops are small, and bf16 passes gave whole maps 2-15% off (L1) on the
        shipped 13x13-patch model, which a 7-patch check could not foresee.
    The gradient methods' pixel map is |attribution| summed over channels; with signed=True the attribution
    summed over channels with its sign (saliency and SmoothGrad then average signed gradients: captum
    Insights' "all" sign; negative = against the class).
    Extra keyword arguments go to captum's `attribute` (e.g. n_steps, internal_batch_size, stdevs).

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).
        target: the class explained per image, LongTensor [B] (or one int for all).
        method: a name of CAPTUM_METHODS.
        kw: captum's options, as above.

    Returns:
        `Attribution`: .pixel [B, H, W], .patch [B, g, g] (summed over each patch), .raw.
    """
    from captum.attr import IntegratedGradients, NoiseTunnel, Occlusion, Saliency

    check_input(model, x)
    if method not in CAPTUM_METHODS:
        raise ExplainInputError(f"unknown attribution method {method!r}; choose from {', '.join(CAPTUM_METHODS)}")
    B, C = x.shape[:2]
    p = model.cfg.patch_size
    with input_gradients(model):
        x = x.detach().clone().requires_grad_(method != "occlusion")  # captum would set it, with a warning
        target = check_target(model, target, B, x.device).clone()  # clones: the caller may be in inference_mode
        kw = {**DEFAULT_OPTIONS.captum_kwargs(method), **kw}
        signed = bool(kw.pop("signed", False))
        if method == "integrated_gradients":
            n_steps, start = kw.pop("n_steps"), ig_baseline(x.detach(), kw.pop("baseline", "mean"), model.cfg)
            kw.setdefault("internal_batch_size", B * _copies_per_pass(B, n_steps, model.cfg.num_patches))
            raw = IntegratedGradients(model).attribute(x, baselines=start, target=target, n_steps=n_steps, **kw)
        elif method == "saliency":
            raw = Saliency(model).attribute(x, target=target, abs=not signed, **kw)
        elif method == "smoothgrad":
            kw.setdefault("nt_samples_batch_size", _copies_per_pass(B, kw["nt_samples"], model.cfg.num_patches))
            raw = NoiseTunnel(Saliency(model)).attribute(x, nt_type="smoothgrad", target=target, abs=not signed, **kw)
        else:
            # a few occluded images per forward pass, as the other perturbation method; no gradients needed
            kw.setdefault("perturbations_per_eval", max(1, images_per_pass(model) // B))
            with torch.no_grad():
                raw = Occlusion(model).attribute(
                    x, sliding_window_shapes=(C, p, p), strides=(C, p, p), baselines=0.0, target=target, **kw
                )
    raw = raw.detach()
    pixel = raw.mean(dim=1) if method == "occlusion" else raw.sum(dim=1) if signed else raw.abs().sum(dim=1)
    return Attribution(pixel=pixel, patch=patch_sum(pixel, p), raw=raw)
