"""Each page's Stop of its long computations (the Causal tab's view, class and knockout profile, the Mechanisms
tab's runs, the Dataset tab's atlas build), one convention for all of them: a request arms a ticket at once, off
the queues (`PageStops.arm`), and its computation carries it (through the page's `gr.State`); a Stop pressed
from then on stops every computation of the page armed before it and not ended, whether it runs (before the next
block its model runs) or still waits for its lane (when it starts). Nothing is consumed: two computations queued
one behind the other both stop, and a request armed after the Stop runs. Each computation ends its ticket
(`PageStops.end`), which says whether the page's Stop is still needed. Dropped when the page closes, and at most
MAX_PAGES are kept."""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import gradio as gr

MAX_PAGES = 1024  # pages whose Stop is remembered at most (each is dropped when its page closes)


def page_of(request: gr.Request | None) -> str | None:
    """The browser page a request came from (Gradio's session hash): its Stop, and the long work its next image
    cancels, are kept under it."""
    return getattr(request, "session_hash", None)


class Stopped(Exception):
    """A page's Stop button ended its computation (the message says so)."""


@dataclass
class Held:
    """A computation's hold on its page's Stop (`PageStops.holding`)."""

    pressed: threading.Event  # set by the page's Stop
    still_needed: bool = True  # once the computation ended: whether the page's Stop is still needed

    def stop_if_pressed(self, message: str) -> None:
        """Raise Stopped(message) once the page's Stop was pressed (called before each block of the work)."""
        if self.pressed.is_set():
            raise Stopped(message)


def stop_once_none_runs(button: gr.Button, still_needed: bool) -> dict:
    """What a computation that ended writes of its page's Stop `button`: disabled when it was the page's last one
    to end, else nothing. Never "enabled": the answers of two computations may reach the page in either order,
    and the one that ended first must not enable the Stop after the last one disabled it."""
    return {} if still_needed else {button: gr.Button(interactive=False)}


class PageStops:
    """One Stop per page (its Gradio session): per page, the tickets of its computations not ended yet, each with
    the event its Stop sets. Thread-safe."""

    def __init__(self) -> None:
        self._pages: OrderedDict[str | None, dict[int, threading.Event]] = OrderedDict()
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()

    def _tickets(self, request: gr.Request | None) -> dict[int, threading.Event]:
        """The page's open tickets (called under the lock)."""
        key = page_of(request)
        tickets = self._pages.setdefault(key, {})
        self._pages.move_to_end(key)
        while len(self._pages) > MAX_PAGES:
            self._pages.popitem(last=False)
        return tickets

    def arm(self, request: gr.Request | None = None) -> int:
        """A computation asked for: its ticket. A Stop pressed from now on stops it; one pressed before does not."""
        with self._lock:
            number = next(self._numbers)
            self._tickets(request)[number] = threading.Event()
        return number

    def press(self, request: gr.Request | None = None) -> None:
        """The Stop button: every computation of this page armed before now and not ended stops."""
        with self._lock:
            for pressed in self._tickets(request).values():
                pressed.set()

    def pressed(self, request: gr.Request | None, ticket: int | None) -> tuple[int, threading.Event]:
        """The computation of `ticket` starts: (its ticket, the event the page's Stop sets). A computation asked
        without a ticket (None, or one that has ended: not by the page's button) is armed now."""
        with self._lock:
            tickets = self._tickets(request)
            if ticket in tickets:
                return ticket, tickets[ticket]
        ticket = self.arm(request)
        with self._lock:
            return ticket, self._tickets(request)[ticket]

    def end(self, request: gr.Request | None, ticket: int | None) -> bool:
        """The computation of `ticket` ended (finished, failed, stopped or cancelled): whether the page's Stop is
        still needed (another computation armed on this page has not ended)."""
        with self._lock:
            tickets = self._tickets(request)
            tickets.pop(ticket, None)
            return bool(tickets)

    @contextmanager
    def holding(self, request: gr.Request | None, ticket: int | None) -> Iterator[Held]:
        """Inside, the computation of `ticket` (`pressed`: None arms one now); on leaving, its ticket ends and
        `Held.still_needed` says whether the page's Stop is still needed."""
        ticket, pressed = self.pressed(request, ticket)
        held = Held(pressed)
        try:
            yield held
        finally:
            held.still_needed = self.end(request, ticket)

    def running(self, request: gr.Request | None) -> bool:
        """Whether a computation armed on this page has not ended (its Stop is enabled while one has not)."""
        with self._lock:
            return bool(self._tickets(request))

    def drop(self, request: gr.Request | None = None) -> None:
        """The page closed."""
        with self._lock:
            self._pages.pop(page_of(request), None)

    def __len__(self) -> int:
        return len(self._pages)
