"""Every saliency method by name, with one calling convention: `METHODS[name](model, x, target, options)`
-> heat map [B, g, g] for the classes `target` [B]. Method settings travel in one `MethodOptions`."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, Iterator

import torch
from torch import nn

from .attention import class_attention, class_specific_attention, rollout
from .attribution import CAPTUM_METHODS, DEFAULT_OPTIONS, MethodOptions, attribution

Method = Callable[..., torch.Tensor]  # (model, x, target, options=DEFAULT_OPTIONS) -> [B, g, g]


def _ca_mean(layer: int) -> Method:
    # target and options are unused: plain class attention does not depend on the class asked about
    return lambda model, x, target, options=DEFAULT_OPTIONS: class_attention(model, x).mean[:, layer]


def _class_specific(model: nn.Module, x: torch.Tensor, target: torch.Tensor,
                    options: MethodOptions = DEFAULT_OPTIONS) -> torch.Tensor:
    return class_specific_attention(model, x, target)


def _rollout(stage: str) -> Method:
    return lambda model, x, target, options=DEFAULT_OPTIONS: rollout(model, x, stage=stage)


def _captum(method: str) -> Method:
    return lambda model, x, target, options=DEFAULT_OPTIONS: attribution(
        model, x, target, method, forward_dtype=options.forward_dtype, **options.captum_kwargs(method)).patch


class MethodTable(Mapping):
    """name -> method. Earlier names (`aliases`) are accepted wherever a name is looked up, but only the
    current names are listed, so menus and result tables show each method once."""

    def __init__(self, methods: dict[str, Method], aliases: dict[str, str]):
        self._methods, self.aliases = methods, aliases

    def canonical(self, name: str) -> str:
        """The current name of `name`; ValueError naming the choices when there is no such method."""
        name = self.aliases.get(name, name)
        if name not in self._methods:
            raise ValueError(f"unknown method {name!r}; choose from {', '.join(self._methods)}")
        return name

    def __getitem__(self, name: str) -> Method:
        return self._methods[self.aliases.get(name, name)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._methods)

    def __len__(self) -> int:
        return len(self._methods)


METHODS = MethodTable({
    "ca1_mean": _ca_mean(0),
    "ca2_mean": _ca_mean(1),
    "class_specific": _class_specific,
    "rollout_raw": _rollout("raw"),
    "rollout_after_proj_l": _rollout("after_proj_l"),
    "rollout_after_proj_w": _rollout("after_proj_w"),
    **{name: _captum(name) for name in CAPTUM_METHODS},
}, aliases={"rollout_before_mixing": "rollout_after_proj_l", "rollout_after_mixing": "rollout_after_proj_w"})


def saliency_map(model: nn.Module, x: torch.Tensor, target: torch.Tensor, method: str,
                 options: MethodOptions = DEFAULT_OPTIONS) -> torch.Tensor:
    """Heat map [B, g, g] of `method` (a current or earlier name) for the classes `target` [B], detached."""
    return METHODS[METHODS.canonical(method)](model, x, target, options).detach()
