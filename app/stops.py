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
from typing import Iterator

import gradio as gr

MAX_PAGES = 1024  # pages whose Stop is remembered at most (each is dropped when its page closes)


def page_of(request: gr.Request | None) -> str | None:
    """The browser page a request came from (Gradio's session hash): its Stop, and the long work its next image
    cancels, are kept under it."""
    return getattr(request, "session_hash", None)


class Stopped(Exception):
    """A page's Stop button ended its computation (the message says so)."""


def stop_once_none_runs(button: gr.Button, still_needed: bool) -> dict:
    """What a computation that ended writes of its page's Stop `button`: disabled when it was the page's last one
    to end, else nothing. Never "enabled": the answers of two computations may reach the page in either order,
    and the one that ended first must not enable the Stop after the last one disabled it."""
    return {} if still_needed else {button: gr.Button(interactive=False)}


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
        self._pages: OrderedDict[str | None, _Page] = OrderedDict()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def _page(self, key: str | None) -> _Page:
        """The page's record (called under the lock)."""
        page = self._pages.setdefault(key, _Page())
        self._pages.move_to_end(key)
        while len(self._pages) > MAX_PAGES:
            self._pages.popitem(last=False)
        return page

    def arm(self, request: gr.Request | None = None) -> None:
        """A computation asked for (at once, off the queues): a Stop pressed from now on stops it, even before its
        handler starts; one pressed before does not."""
        with self._lock:
            page = self._page(page_of(request))
            page.asks += 1
            page.waiting = page.asks

    def press(self, request: gr.Request | None = None) -> None:
        """The Stop button: every computation of this page asked before now stops."""
        with self._lock:
            page = self._page(page_of(request))
            page.stopped_upto = page.asks

    def stopped(self, key: str | None, ask: int) -> bool:
        with self._lock:
            return self._page(key).stopped_upto >= ask

    @contextmanager
    def holding(self, request: gr.Request | None) -> Iterator[Held]:
        """Inside, a computation of the page runs: it takes the page's latest ask not taken yet (none: it is asked
        now, not by the page's controls). On leaving, `Held.still_needed` says whether another computation of the
        page still runs."""
        key, me = page_of(request), next(self._ids)
        with self._lock:
            page = self._page(key)
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
                page = self._page(key)
                page.running.pop(me, None)
                held.still_needed = bool(page.running)

    def running(self, request: gr.Request | None) -> bool:
        """Whether a computation of this page runs (its Stop is enabled while one does)."""
        with self._lock:
            return bool(self._page(page_of(request)).running)

    def drop(self, request: gr.Request | None = None) -> None:
        """The page closed."""
        with self._lock:
            self._pages.pop(page_of(request), None)

    def __len__(self) -> int:
        return len(self._pages)
