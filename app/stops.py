"""Each page's Stop of its long computation (the Causal tab's view, the Dataset tab's atlas build): a request arms
it off the model queue; a Stop pressed from then on, even while the computation still waits in the queue, stops it
when it starts; a computation that stops consumes it. Dropped when the page closes, and at most MAX_PAGES are kept."""

from __future__ import annotations

import threading
from collections import OrderedDict

import gradio as gr

MAX_PAGES = 1024  # pages whose Stop is remembered at most (each is dropped when its page closes)


def page_of(request: gr.Request | None) -> str | None:
    """The browser page a request came from (Gradio's session hash): its Stop, and the long work its next image
    cancels, are kept under it."""
    return getattr(request, "session_hash", None)


class Stopped(Exception):
    """A page's Stop button ended its computation (the message says so)."""


class PageStops:
    """One Stop per page (its Gradio session)."""

    def __init__(self) -> None:
        self._pressed: OrderedDict[str | None, threading.Event] = OrderedDict()
        self._lock = threading.Lock()

    def _event(self, request: gr.Request | None) -> threading.Event:
        key = page_of(request)
        with self._lock:
            event = self._pressed.setdefault(key, threading.Event())
            self._pressed.move_to_end(key)
            while len(self._pressed) > MAX_PAGES:
                self._pressed.popitem(last=False)
        return event

    def arm(self, request: gr.Request | None = None) -> None:
        """A new computation asked for: a Stop pressed before it counts no more."""
        self._event(request).clear()

    def press(self, request: gr.Request | None = None) -> None:
        """The Stop button: this page's computation ends before the next block the model runs."""
        self._event(request).set()

    def pressed(self, request: gr.Request | None) -> threading.Event:
        return self._event(request)

    def drop(self, request: gr.Request | None = None) -> None:
        """The page closed."""
        with self._lock:
            self._pressed.pop(page_of(request), None)

    def __len__(self) -> int:
        return len(self._pressed)
