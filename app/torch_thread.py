"""One thread runs all of the app's torch work: loading models and every handler that computes.

Why one: torch parallelises each operation over OpenMP threads, and every Python thread that calls torch
gets its own team of them. Measured on the 2-core CPU this app is developed on (torch 2.14, xxs24_224,
`session.analyse` of one photo in bf16): 33 ms when every torch call of the process ran on one thread,
92-100 ms once a second thread had run torch too (the main thread loading the model, then Gradio's worker
threads analysing), and in the served app the class-attention view waited on the slow one. One intra-op
thread everywhere took 43 ms, but halved the speed of the saliency tab's batched passes; passive OpenMP
waiting (OMP_WAIT_POLICY) made every call slow (85 ms).

The price: sessions take turns on the model (a long saliency method delays another page's analysis by
up to one method's time); they did share the same two cores before, and each turn is now faster.

One-image passes (analysis, redraws, talking heads) leave one core to the browser that shows their result,
which mostly runs on the same machine: while Chromium drew the page after a click, one plain xxs24_224
forward in the server took ~74 ms with torch's two threads and ~61 ms with one (bare Gradio app, 2 cores;
alone: 42 and 62 ms). Batched work (the saliency tab's perturbation passes) uses every thread: 2 threads
ran a batch of 8 in 0.25-0.3 s, one in 0.44 s.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

import torch

T = TypeVar("T")
_ALL_THREADS = torch.get_num_threads()  # torch's default (the physical cores), or OMP_NUM_THREADS

_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cait-torch")
_THREAD: list[threading.Thread] = []  # the executor's thread, once it has run something


def _remember_thread() -> None:
    _THREAD[:] = [threading.current_thread()]


def on_torch_thread() -> bool:
    return bool(_THREAD) and threading.current_thread() is _THREAD[0]


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) on the torch thread, waiting for its result (exceptions are raised here). It
    runs in a copy of the caller's context: Gradio finds the event of gr.Info and gr.Progress through
    context variables. Called on the torch thread itself, fn runs at once (no deadlock)."""
    if on_torch_thread():
        return fn(*args, **kwargs)
    context = contextvars.copy_context()

    def run() -> T:
        _remember_thread()
        return context.run(fn, *args, **kwargs)

    return _EXECUTOR.submit(run).result()


def all_threads() -> int:
    """Intra-op threads for batched work: torch's number when this module was imported. The caller's own
    setting does not count (torch's thread count is per thread: a script may have set its own to 1)."""
    return _ALL_THREADS


def interactive_threads() -> int:
    """Intra-op threads for one-image passes: all but one of torch's (at least one)."""
    return max(1, _ALL_THREADS - 1)


def _threads(n: int, fn: Callable[..., T]) -> Callable[..., T]:
    def run(*args: Any, **kwargs: Any) -> T:
        torch.set_num_threads(n)  # only this thread calls torch, so the setting is this call's alone
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(_ALL_THREADS)

    return run


def handler(fn: Callable, *, batched: bool = False) -> Callable:
    """`fn` as an event handler whose body runs on the torch thread, with `interactive_threads()` (all
    threads when `batched`); a generator handler runs each step there and yields between steps, so that
    Gradio sends each update as before. The signature Gradio reads (event data, progress, API types) is
    fn's."""
    n = all_threads() if batched else interactive_threads()
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def steps(*args, **kwargs):
            generator, done = call(fn, *args, **kwargs), object()
            while (item := call(_threads(n, next), generator, done)) is not done:
                yield item

        return steps

    @functools.wraps(fn)
    def body(*args, **kwargs):
        return call(_threads(n, fn), *args, **kwargs)

    return body


__all__ = ["all_threads", "call", "handler", "interactive_threads", "on_torch_thread"]
