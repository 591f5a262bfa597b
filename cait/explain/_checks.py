"""The checks at the door of every public explanation, as captum makes them: the model is a CaiT (and, where a
method reads through it, has a class-attention stage), x is a finite normalised batch of the model's input
shape, target holds one class in range per image. Each failure is an `ExplainInputError` naming the argument."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..config import CaiTConfig
from ..errors import InputError

PIXEL_RANGE = (-10.0, 11.0)  # what a normalised value may stand for in pixels: [0, 1] with room for noise;
# a 0..255 image (never normalised) lies far outside


class ExplainInputError(InputError):
    """A model, x or target an explanation cannot take; the message names the argument."""


def check_model(model: nn.Module) -> CaiTConfig:
    """`model`'s config, or ExplainInputError unless it is one of our CaiTs (`cait.load_model`)."""
    cfg = getattr(model, "cfg", None)
    if not isinstance(model, nn.Module) or not isinstance(cfg, CaiTConfig):
        raise ExplainInputError(f"model must be a CaiT from cait.load_model, got {type(model).__name__}")
    return cfg


def check_class_stage(model: nn.Module) -> None:
    """ExplainInputError unless the model reads the image through CaiT's class-attention stage into a
    class-token head: what the lens, patching, DLA, knockouts and head ablation take apart."""
    cfg = check_model(model)
    if cfg.class_token_at is not None or cfg.global_pool != "token" or cfg.depth_token_only == 0:
        raise ExplainInputError(
            "model has no class-attention stage read by a class-token head (class_token_at="
            f"{cfg.class_token_at}, global_pool={cfg.global_pool!r}, depth_token_only={cfg.depth_token_only}); "
            "this explanation takes that stage apart"
        )


def check_ca_layer(model: nn.Module, method: str, layer: int) -> None:
    """ExplainInputError unless the model has CA layer `layer` (0-based), which `method` reads."""
    depth = check_model(model).depth_token_only
    if not 0 <= layer < depth:
        named = ", ".join(f"ca{k}_mean" for k in range(1, depth + 1)) or "none"
        raise ExplainInputError(
            f"method {method!r} reads CA layer {layer + 1}; this model has {depth} CA layer(s) (its methods of a "
            f"CA layer: {named})"
        )


def check_input(model: nn.Module, x: torch.Tensor, *, name: str = "x") -> None:
    """ExplainInputError unless `x` (called `name` in the message) is a finite float batch [B, C, H, W] of the
    model's input shape whose values can be normalised pixels."""
    cfg = check_model(model)
    expected = (cfg.in_chans, cfg.img_size, cfg.img_size)
    if not isinstance(x, torch.Tensor):
        raise ExplainInputError(f"{name} must be a tensor [B, {', '.join(map(str, expected))}], got {type(x).__name__}")
    if x.dim() != 4 or tuple(x.shape[1:]) != expected or x.shape[0] == 0:
        raise ExplainInputError(
            f"{name} must be a normalised batch [B, {', '.join(map(str, expected))}] for this model, "
            f"got {list(x.shape)}"
        )
    if not x.is_floating_point():
        raise ExplainInputError(f"{name} must be a float tensor (cait.preprocess.normalise), got {x.dtype}")
    low, high = _normalised_range(cfg, x)
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        raise ExplainInputError(f"{name} holds NaN or infinite values")
    if bool((x < low).any() or (x > high).any()):
        raise ExplainInputError(
            f"{name} holds values in [{x.min().item():.4g}, {x.max().item():.4g}], not a normalised image "
            f"(normalise pixels in [0, 1] with cait.preprocess.normalise)"
        )


def _normalised_range(cfg: CaiTConfig, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per channel [1, C, 1, 1], the normalised values of the pixels PIXEL_RANGE bounds."""
    mean = torch.tensor(cfg.mean, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(cfg.std, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    return (PIXEL_RANGE[0] - mean) / std, (PIXEL_RANGE[1] - mean) / std


def check_target(
    model: nn.Module, target: torch.Tensor | Sequence[int] | int, batch: int, device: torch.device
) -> torch.Tensor:
    """`target` as a LongTensor [batch] on `device`, or ExplainInputError unless it holds one integer class
    index in range per image (an int is taken for every image, as captum takes it)."""
    classes = check_model(model).num_classes
    if isinstance(target, bool):
        raise ExplainInputError(f"target must be class indices, got {target!r}")
    if isinstance(target, int):
        target = torch.full((batch,), target, dtype=torch.long)
    try:
        target = torch.as_tensor(target)
    except (TypeError, ValueError, RuntimeError):
        raise ExplainInputError(f"target must be class indices, one per image, got {type(target).__name__}") from None
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise ExplainInputError(f"target must hold integer class indices, got {target.dtype}")
    if target.dim() == 0:
        target = target.expand(batch)
    elif target.numel() == batch:
        target = target.reshape(-1)  # [B, 1] as captum takes it
    if target.dim() != 1 or target.shape[0] != batch:
        raise ExplainInputError(f"target must hold one class per image: {batch} for x, got shape {list(target.shape)}")
    if bool((target < 0).any() or (target >= classes).any()):
        raise ExplainInputError(
            f"target holds classes outside 0..{classes - 1} (this model has {classes}): {target.tolist()[:8]}"
        )
    return target.to(device=device, dtype=torch.long)
