"""Each page's Stop of its long computations (the Causal tab's view, class and knockout profile, the Mechanisms
tab's runs, the Dataset tab's atlas build), one convention for all of them. The control that asks for one arms it
at once, off the queues (`PageStops.arm`: the ask is numbered); the computation, when its handler starts, takes
the page's latest ask not taken yet (`PageStops.holding`). A Stop pressed stops every computation of the page
asked before it and not ended, whether it runs (before the next block its model runs) or still waits for its
lane (when it starts). Nothing is consumed: two computations queued one behind the other both stop, and one
asked after the Stop runs.

Why the latest ask, not one carried by the event: Gradio may fire a control's event twice for one choice (a
dropdown's `input`) and run the queued handler once, or drop a handler while the same event's last one is
pending; an ask that no handler takes is left behind (the next one taken discards it) and keeps nothing going.
The Stop is enabled while a computation of the page runs. Dropped when the page closes; at most MAX_PAGES kept."""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Generic, Iterator, TypeVar

import gradio as gr

T = TypeVar("T")

MAX_PAGES = 1024  # pages whose Stops and values (`ByPage`) are kept at most (each dropped when its page closes)


def page_of(request: gr.Request | None) -> str | None:
    """The browser page a request came from (Gradio's session hash): its Stop, and the long work its next image
    cancels, are kept under it."""
    return getattr(request, "session_hash", None)


class ByPage(Generic[T]):
    """A value per page (key: `page_of`), made by `new` when first asked for, the latest MAX_PAGES kept (each is
    dropped when its page closes). Thread-safe; `lock` guards a value's own changes too."""

    def __init__(self, new: Callable[[], T]) -> None:
        self._values: OrderedDict[str | None, T] = OrderedDict()
        self._new, self.lock = new, threading.RLock()

    def of(self, key: str | None) -> T:
        """The page's value (made now if it has none)."""
        with self.lock:
            value = self._values[key] = self._values.pop(key) if key in self._values else self._new()
            while len(self._values) > MAX_PAGES:
                self._values.popitem(last=False)
            return value

    def drop(self, request: gr.Request | None = None) -> None:
        """The page closed."""
        with self.lock:
            self._values.pop(page_of(request), None)

    def __len__(self) -> int:
        return len(self._values)


class Stopped(Exception):
    """A page's Stop button ended its computation (the message says so)."""


@dataclass
class _Page:
    """One page's asks and Stops: asks are numbered in order; a Stop stops every ask up to `stopped_upto`."""

    asks: int = 0
    waiting: int | None = None  # the latest ask no computation has taken yet
    stopped_upto: int = 0
    running: dict[int, int] = field(default_factory=dict)  # computation -> the ask it took


@dataclass
class Held:
    """A computation's hold on its page's Stop (`PageStops.holding`)."""

    stops: PageStops
    page: str | None
    ask: int
    still_needed: bool = True  # once the computation ended: whether the page's Stop is still needed

    def pressed(self) -> bool:
        """Whether the page's Stop was pressed since the computation was asked for."""
        return self.stops.stopped(self.page, self.ask)

    def stop_if_pressed(self, message: str) -> None:
        """Raise Stopped(message) once the page's Stop was pressed (called before each block of the work)."""
        if self.pressed():
            raise Stopped(message)


class PageStops:
    """One Stop per page (its Gradio session). Thread-safe."""

    def __init__(self) -> None:
        self._pages = ByPage(_Page)
        self._lock, self._ids = self._pages.lock, itertools.count(1)

    def arm(self, request: gr.Request | None = None) -> None:
        """A computation asked for (at once, off the queues): a Stop pressed from now on stops it, even before its
        handler starts; one pressed before does not."""
        with self._lock:
            page = self._pages.of(page_of(request))
            page.asks += 1
            page.waiting = page.asks

    def press(self, request: gr.Request | None = None) -> None:
        """The Stop button: every computation of this page asked before now stops."""
        with self._lock:
            page = self._pages.of(page_of(request))
            page.stopped_upto = page.asks

    def stopped(self, key: str | None, ask: int) -> bool:
        with self._lock:
            return self._pages.of(key).stopped_upto >= ask

    @contextmanager
    def holding(self, request: gr.Request | None) -> Iterator[Held]:
        """Inside, a computation of the page runs: it takes the page's latest ask not taken yet (none: it is asked
        now, not by the page's controls). On leaving, `Held.still_needed` says whether another computation of the
        page still runs."""
        key, me = page_of(request), next(self._ids)
        with self._lock:
            page = self._pages.of(key)
            if page.waiting is None:
                page.asks += 1
                page.waiting = page.asks
            ask, page.waiting = page.waiting, None
            page.running[me] = ask
        held = Held(self, key, ask)
        try:
            yield held
        finally:
            with self._lock:
                page = self._pages.of(key)
                page.running.pop(me, None)
                held.still_needed = bool(page.running)

    def running(self, request: gr.Request | None) -> bool:
        """Whether a computation of this page runs (its Stop is enabled while one does)."""
        with self._lock:
            return bool(self._pages.of(page_of(request)).running)

    def drop(self, request: gr.Request | None = None) -> None:
        """The page closed."""
        self._pages.drop(request)

    def __len__(self) -> int:
        return len(self._pages)
