"""Every saliency method by name, with one calling convention: `METHODS[name](model, x, target, options)`
-> heat map [B, g, g] for the classes `target` [B]. Method settings travel in one `MethodOptions`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from ._checks import ExplainInputError, check_ca_layer, check_input, check_target
from .attention import (
    HEAD_FUSIONS,
    ROLLOUT_STAGES,
    class_attention,
    class_specific_attention,
    gradient_rollout,
    rollout,
    rollouts,
)
from .attribution import (
    CAPTUM_METHODS,
    CAPTUM_OPTIONS,
    DEFAULT_OPTIONS,
    SIGNED,
    MethodOptions,
    Option,
    add_option_source,
    attribution,
    captum_keywords,
)

Method = Callable[..., torch.Tensor]  # (model, x, target, options=DEFAULT_OPTIONS) -> [B, g, g]

ROLLOUT_HEAD_FUSION = Option("rollout_head_fusion", "mean", "Rollout head fusion", choices=HEAD_FUSIONS)
ROLLOUT_DISCARD_RATIO = Option(
    "rollout_discard_ratio", 0.0, "Rollout discard ratio (lowest weights of each layer set to 0)", bounds=(0.0, 0.95),
    step=0.05,
)  # fmt: skip


@dataclass(frozen=True)
class Entry:
    """A method with the options it takes: `compute(model, x, target, **{option.name: value})`, as captum keeps a
    method's settings in its signature; called as every method is, `entry(model, x, target, options)`, it reads
    its own options out of the `MethodOptions`. caption: how its map's settings are said (str.format of the option
    values and SmoothGrad's `seed`; the options it leaves out follow as "name value")."""

    compute: Callable[..., torch.Tensor]
    options: tuple[Option, ...] = ()
    caption: str = ""

    def __call__(
        self, model: nn.Module, x: torch.Tensor, target: torch.Tensor, options: MethodOptions = DEFAULT_OPTIONS
    ) -> torch.Tensor:
        return self.compute(model, x, target, **{o.name: getattr(options, o.name) for o in self.options})

    def said(self, options: MethodOptions, seed: int) -> list[str]:
        """The settings that shape this method's map, in a few words each ("signed" when signed is set)."""
        values = {o.name: getattr(options, o.name) for o in self.options}
        said = [self.caption.format(**values, seed=seed)] if self.caption else []
        rest = [o for o in self.options if o is not SIGNED and "{" + o.name not in self.caption]
        said += [f"{o.name} {values[o.name]:g}" if o.bounds else f"{o.name} {values[o.name]}" for o in rest]
        return said + (["signed"] if values.get("signed") else [])


def _ca_mean(layer: int) -> Entry:
    # target is unused: plain class attention does not depend on the class asked about
    return Entry(lambda model, x, target: class_attention(model, x).mean[:, layer])


def _rollout(stage: str) -> Entry:
    return Entry(
        lambda model, x, target, **options: rollout(
            model, x, stage=stage, head_fusion=options["rollout_head_fusion"],
            discard_ratio=options["rollout_discard_ratio"],
        ),
        (ROLLOUT_HEAD_FUSION, ROLLOUT_DISCARD_RATIO),
        "{rollout_head_fusion} fusion, discard {rollout_discard_ratio:g}",
    )  # fmt: skip


_CAPTUM_CAPTIONS = {
    "integrated_gradients": "{ig_steps} steps from the {ig_baseline} baseline",
    "smoothgrad": "{smoothgrad_samples} samples, noise {smoothgrad_stdev:g}, seed {seed}",
}


def _captum(method: str) -> Entry:
    return Entry(
        lambda model, x, target, **options: (
            attribution(model, x, target, method, **captum_keywords(method, options)).patch
        ),
        CAPTUM_OPTIONS[method],
        _CAPTUM_CAPTIONS.get(method, ""),
    )


class MethodTable(Mapping):
    """name -> method, with a lookup that names the choices when there is no such method."""

    def __init__(self, methods: dict[str, Entry]):
        self._methods = methods

    def canonical(self, name: str) -> str:
        """`name` if it is a method (caK_mean for any CA layer K from 1); ExplainInputError naming the choices
        otherwise."""
        if name not in self._methods and ca_mean_layer(name) is None:
            raise ExplainInputError(f"unknown method {name!r}; choose from {', '.join(self._methods)}")
        return name

    def __getitem__(self, name: str) -> Entry:
        layer = ca_mean_layer(name)
        return self._methods[name] if layer is None else _ca_mean(layer)

    def entries(self) -> Iterator[Entry]:
        """Every listed method's entry, in order."""
        return iter(self._methods.values())

    def names(self, ca_depth: int) -> list[str]:
        """The methods for a model of `ca_depth` CA layers: caK_mean for each of its layers, then the others."""
        return [*ca_mean_methods(ca_depth), *(name for name in self._methods if ca_mean_layer(name) is None)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._methods)

    def __len__(self) -> int:
        return len(self._methods)


_CA_MEAN = re.compile(r"ca([1-9][0-9]*)_mean")


def ca_mean_methods(ca_depth: int) -> dict[str, int]:
    """The head-mean map of each CA layer of a model of `ca_depth` CA layers: name (caK_mean) -> layer (0-based)."""
    return {f"ca{layer + 1}_mean": layer for layer in range(ca_depth)}


# the CA layers' methods listed when no model is at hand (every paper variant has two CA layers); `MethodTable.names`
# lists a model's, and caK_mean reads the K-th of any model that has it
CA_MEAN_METHODS = ca_mean_methods(2)


def ca_mean_layer(name: str) -> int | None:
    """The CA layer (0-based) method `name` reads (caK_mean: the K-th, for any K from 1), None for the others."""
    found = _CA_MEAN.fullmatch(name) if isinstance(name, str) else None
    return None if found is None else int(found.group(1)) - 1


def _checked_methods(model: nn.Module, methods: Iterable[str]) -> list[str]:
    """`methods` by their names, each one a method (`METHODS.canonical`) that this model can run: one that reads
    a CA layer needs the model to have it (`check_ca_layer`)."""
    names = [METHODS.canonical(m) for m in methods]
    for name in names:
        if (layer := ca_mean_layer(name)) is not None:
            check_ca_layer(model, name, layer)
    return names


ROLLOUT_METHODS = {f"rollout_{stage}": stage for stage in ROLLOUT_STAGES}  # name -> SA attention stage

METHODS = MethodTable(
    {
        **{name: _ca_mean(layer) for name, layer in CA_MEAN_METHODS.items()},
        "class_specific": Entry(class_specific_attention),
        **{name: _rollout(stage) for name, stage in ROLLOUT_METHODS.items()},
        "gradient_rollout": Entry(gradient_rollout),
        **{name: _captum(name) for name in CAPTUM_METHODS},
    }
)
add_option_source(lambda: (entry.options for entry in METHODS.entries()))


def saliency_map(
    model: nn.Module, x: torch.Tensor, target: torch.Tensor, method: str, options: MethodOptions = DEFAULT_OPTIONS
) -> torch.Tensor:
    """Heat map of one saliency method, detached.

    Args:
        model: a CaiT (`cait.load_model`).
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).
        target: the class explained per image, LongTensor [B] (or one int for all).
        method: a name of `METHODS` (class attention, rollouts, gradient rollout, captum's methods).
        options: the methods' settings (`MethodOptions`).

    Returns:
        The heat map on the patch grid [B, g, g], higher = more important.
    """
    check_input(model, x)
    (name,) = _checked_methods(model, [method])
    return METHODS[name](model, x, check_target(model, target, x.shape[0], x.device), options).detach()


def saliency_maps(
    model: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    methods: Iterable[str],
    options: MethodOptions = DEFAULT_OPTIONS,
    *,
    class_attention_maps: torch.Tensor | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(current name, `saliency_map`) for each of `methods` in order, as each is done, the work several
    methods share done once: every rollout asked for comes from one forward pass (at the first of them),
    and with class_attention_maps [B, L, heads, g, g] (e.g. from the analysis already shown) the CA head
    means are read from it instead of another forward pass."""
    check_input(model, x)
    names = _checked_methods(model, methods)
    target = check_target(model, target, x.shape[0], x.device)
    done: dict[str, torch.Tensor] = {}
    for name in names:
        if name in done:
            pass
        elif ca_mean_layer(name) is not None and class_attention_maps is not None:
            done[name] = class_attention_maps.mean(dim=2)[:, ca_mean_layer(name)]
        elif name in ROLLOUT_METHODS:
            stages = tuple(ROLLOUT_METHODS[n] for n in names if n in ROLLOUT_METHODS)
            maps = rollouts(
                model,
                x,
                stages=stages,
                head_fusion=options.rollout_head_fusion,
                discard_ratio=options.rollout_discard_ratio,
            )
            done.update({f"rollout_{stage}": heat for stage, heat in maps.items()})
        else:
            done[name] = METHODS[name](model, x, target, options)
        yield name, done[name].detach()
