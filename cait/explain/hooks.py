"""Forward hooks that explanations open and close around a pass: recording a module's output or input,
or substituting a value for it. Each acts only on passes of the thread that opened it: a model shared by two
threads (the app runs quick views beside long work) keeps one thread's pass out of the other's hooks."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


def this_thread_only(hook: Callable) -> Callable:
    """`hook` as a forward (pre-)hook that acts only on passes of the thread that made it (None elsewhere:
    the module's input or output unchanged)."""
    owner = threading.get_ident()
    return lambda *args: hook(*args) if threading.get_ident() == owner else None


@contextmanager
def registered(handles: Iterable[RemovableHandle]) -> Iterator[None]:
    """While open, the hooks behind `handles` (just registered by the caller) stay; on exit they are removed,
    however the pass ends."""
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def recorded(points: dict[object, tuple[nn.Module, bool]]) -> Iterator[dict]:
    """While open, each forward call of a point's module stores its output (pre=True: its first input)
    under the point's key in the yielded dict; the hooks are removed on exit."""
    seen: dict = {}

    def keep(key):
        return this_thread_only(lambda module, args, *output: seen.__setitem__(key, output[0] if output else args[0]))

    handles = [
        module.register_forward_pre_hook(keep(key)) if pre else module.register_forward_hook(keep(key))
        for key, (module, pre) in points.items()
    ]
    with registered(handles):
        yield seen


@contextmanager
def substituted(module: nn.Module, value: torch.Tensor, *, pre: bool = False) -> Iterator[None]:
    """While open, `module` returns `value` (pre=True: receives it as its only input) on every call."""
    if pre:
        handle = module.register_forward_pre_hook(this_thread_only(lambda m, args: (value,)))
    else:
        handle = module.register_forward_hook(this_thread_only(lambda m, args, output: value))
    with registered([handle]):
        yield


@contextmanager
def silenced(module: nn.Module) -> Iterator[None]:
    """While open, `module` returns zeros in the shape of its output on every call."""
    handle = module.register_forward_hook(this_thread_only(lambda m, args, output: torch.zeros_like(output)))
    with registered([handle]):
        yield


@contextmanager
def on_inputs(module: nn.Module, fn: Callable[[nn.Module, tuple], tuple | None]) -> Iterator[None]:
    """While open, fn(module, args) runs before every forward call of `module`; a tuple it returns replaces the
    call's inputs (None: unchanged), an exception it raises ends the pass there."""
    with registered([module.register_forward_pre_hook(this_thread_only(fn))]):
        yield


@contextmanager
def before_each(modules: Iterable[nn.Module], check: Callable[[], None]) -> Iterator[None]:
    """While open, `check()` runs before every forward call of each of `modules`; an exception it raises ends
    the pass there (a Stop button heard within one block's time, whatever the pass)."""
    handles = [module.register_forward_pre_hook(this_thread_only(lambda module, args: check())) for module in modules]
    with registered(handles):
        yield
