"""Input attributions through captum, per pixel and summed per patch.

Baselines are 0 in normalised space, i.e. an image at the dataset mean colour (a flat grey field).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
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
class Option:
    """One setting of a saliency method, declared beside the method (`cait.explain.methods.Entry`): its default
    (whose type is the option's), its bounds, its help line. The app's controls, /analyze's checks and the captions
    read these, so that a new option is the method's keyword and this declaration, nothing else."""

    name: str  # the method's keyword, /analyze's keyword, the app's control
    default: Any
    help: str  # one line: what it sets (the app's label)
    bounds: tuple[float, float] | None = None  # what a caller may ask (inclusive), for a number
    step: float | None = None  # the granularity the app's slider offers, for a number
    choices: tuple[str, ...] = ()  # the values of a named option
    note: str = ""  # a hint beside the control

    @property
    def kind(self) -> type:
        """The option's type: its default's."""
        return type(self.default)


# integrated gradients' baselines, as captum Insights offers them: the normalisation's mean colour (0 in
# normalised units, the usual default), a black image, the image blurred, Gaussian noise
IG_BASELINES = ("mean", "black", "blurred", "noise")
# IG and SmoothGrad's bounds keep any call from holding the model for minutes (the cost grows with the count)
IG_STEPS = Option("ig_steps", 32, "Integrated-gradients steps", bounds=(4, 128), step=4)
IG_BASELINE = Option(
    "ig_baseline", "mean", "Integrated-gradients baseline", choices=IG_BASELINES,
    note="mean: the normalisation's mean colour",
)  # fmt: skip
SIGNED = Option(
    "signed", False, "Signed attributions (captum methods: red for the class, blue against it; else |attribution|)"
)
SMOOTHGRAD_SAMPLES = Option("smoothgrad_samples", 16, "SmoothGrad samples", bounds=(2, 64), step=2)
SMOOTHGRAD_STDEV = Option(
    "smoothgrad_stdev", 0.15, "SmoothGrad noise (std, normalised units)", bounds=(0.0, 1.0), step=0.05
)
# each captum method's options (occlusion: none, its map always signed), and the keyword of `attribution` each sets
CAPTUM_OPTIONS: dict[str, tuple[Option, ...]] = {
    "integrated_gradients": (IG_STEPS, IG_BASELINE, SIGNED),
    "saliency": (SIGNED,),
    "smoothgrad": (SMOOTHGRAD_SAMPLES, SMOOTHGRAD_STDEV, SIGNED),
    "occlusion": (),
}
_CAPTUM_KEYWORDS = {"ig_steps": "n_steps", "ig_baseline": "baseline", "smoothgrad_samples": "nt_samples"}
_CAPTUM_KEYWORDS |= {"smoothgrad_stdev": "stdevs"}


# What declares the options of the methods beyond captum's: `cait.explain.methods` adds its menu's entries when it
# is imported (it imports this module, so this module cannot import it).
_OPTION_SOURCES: list[Callable[[], Iterable[tuple[Option, ...]]]] = []


def add_option_source(source: Callable[[], Iterable[tuple[Option, ...]]]) -> None:
    """Makes `method_options` also read `source()`: the options of each method it declares, read when asked."""
    _OPTION_SOURCES.append(source)


def method_options() -> dict[str, Option]:
    """Every option of every method of `cait.explain.METHODS`, by name: captum's methods' first (in the order their
    records have always listed them), then the others' in the menu's order."""
    declared = (*CAPTUM_OPTIONS.values(), *(options for source in _OPTION_SOURCES for options in source()))
    return {o.name: o for options in declared for o in options}


class MethodOptions:
    """The settings of the explanation methods that have any (`method_options`), each its declared default unless
    given. Every method of `cait.explain.METHODS` takes the whole set and reads what concerns it, so callers never
    special-case a method. Immutable; options.ig_steps reads one."""

    def __init__(self, **values: Any):
        if values and (unknown := set(values) - set(method_options())):
            raise TypeError(f"unknown method option(s) {sorted(unknown)}; choose from {', '.join(method_options())}")
        object.__setattr__(self, "_given", dict(values))

    def __getattr__(self, name: str) -> Any:
        given = self.__dict__.get("_given", {})
        if name in given:
            return given[name]
        option = method_options().get(name) if not name.startswith("_") else None
        if option is None:
            raise AttributeError(name)
        return option.default

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("MethodOptions is immutable")

    def as_dict(self) -> dict[str, Any]:
        """Every option by name, in `method_options`' order."""
        return {name: getattr(self, name) for name in method_options()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MethodOptions) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.as_dict().items()))

    def __repr__(self) -> str:
        return f"MethodOptions({', '.join(f'{k}={v!r}' for k, v in self.as_dict().items())})"

    def captum_kwargs(self, method: str) -> dict[str, Any]:
        """The keyword arguments of `attribution` for `method` that these options set."""
        return captum_keywords(method, {o.name: getattr(self, o.name) for o in CAPTUM_OPTIONS.get(method, ())})


def captum_keywords(method: str, values: dict[str, Any]) -> dict[str, Any]:
    """`values` of `method`'s options (`CAPTUM_OPTIONS`) as the keywords of `attribution` (`signed` only when set)."""
    said = {_CAPTUM_KEYWORDS.get(name, name): value for name, value in values.items()}
    return said if said.get("signed") else {k: v for k, v in said.items() if k != "signed"}


DEFAULT_OPTIONS = MethodOptions()


class _Bounds(Mapping):
    """name -> (low, high) of every numeric option, as the methods declare them now (`method_options`)."""

    def _bounds(self) -> dict[str, tuple[float, float]]:
        return {name: o.bounds for name, o in method_options().items() if o.bounds is not None}

    def __getitem__(self, name: str) -> tuple[float, float]:
        return self._bounds()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._bounds())

    def __len__(self) -> int:
        return len(self._bounds())


# what a caller may ask of each numeric option (inclusive): the app's sliders span these, and /analyze refuses
# anything outside
OPTION_BOUNDS: Mapping[str, tuple[float, float]] = _Bounds()


class OptionError(InputError):
    """A method option outside its bounds, not one of its choices or of the wrong type; the message names it."""


def checked_option(option: Option, value: Any) -> Any:
    """`value` converted to `option`'s type and checked against its bounds or choices; OptionError in one line."""
    kind, name = option.kind, option.name
    try:
        number = float(value) if kind is int else None
        if number is not None and not number.is_integer():
            raise ValueError
        typed = kind(value) if number is None else int(number)
    except (TypeError, ValueError, OverflowError):
        what = {int: "a whole number", float: "a number"}.get(kind, kind.__name__)
        raise OptionError(f"{name} must be {what}, got {shown(value)}") from None
    if option.bounds is not None and not option.bounds[0] <= typed <= option.bounds[1]:  # NaN fails too
        low, high = option.bounds
        raise OptionError(f"{name} must be between {low:g} and {high:g}, got {typed:g}")
    if option.choices and typed not in option.choices:
        raise OptionError(f"unknown {option.help[0].lower()}{option.help[1:]} {shown(value)}; choose from "
                          f"{', '.join(option.choices)}")  # fmt: skip
    return typed


def checked_options(**values: Any) -> MethodOptions:
    """`MethodOptions` from loosely typed values (a web client's numbers and strings), each converted to its
    option's type and checked against its bounds and choices (`Option`).

    Args:
        values: options by name (`method_options`); the ones not given keep their defaults.

    Returns:
        The options. Raises OptionError in one line naming the first option that does not fit."""
    known = method_options()
    return MethodOptions(**{name: checked_option(known[name], value) for name, value in values.items()})


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
