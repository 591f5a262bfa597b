"""What every tab shares: the page's own components (the image, the model choice, the status line, the downloads),
the tab labels the page compares, the model queue's event settings, and the one rule for errors (`answering`).
The bottom of the app: it imports no other module of `app/`."""

from __future__ import annotations

import functools
import inspect
import logging
import math
from dataclasses import dataclass, fields
from typing import Any, Callable

import gradio as gr

from cait.errors import InputError

log = logging.getLogger("cait.app")

CLASS_ATTENTION_TAB, CAUSAL_TAB, MECHANISMS_TAB = "Class attention", "Causal", "Mechanisms"  # labels compared
# the events that run the model: one queue, so a page waits its turn; not listed in the API
MODEL_EVENTS = dict(concurrency_id="model", api_visibility="private")
# the events of long work (`app.torch_thread.call_long`): a group of their own, unlimited (the long lane takes its
# jobs one at a time), so that they never hold the model queue's places while they wait or run
LONG_EVENTS = dict(concurrency_id="long", concurrency_limit=None, api_visibility="private")
INTERNAL_ERROR = "**Internal error:** something went wrong on the server (its log has the details)."


@dataclass
class Shared:
    """The components outside the tabs (and the page's state): each tab's events may read or write them."""

    choice: gr.State  # the session's ModelChoice
    analysis: gr.State  # the session's Analysis (or None)
    open_tab: gr.State  # the label of the tab on show: the Causal tab is computed only once it is open
    header: gr.Markdown
    image_in: gr.Image
    examples: gr.Gallery
    top5: gr.HTML
    status: gr.Markdown
    grid_file: gr.File
    json_file: gr.File
    tabs: gr.Tabs


@dataclass(frozen=True)
class ImageAsk:
    """What a new image (an example clicked, an atlas's exemplar) is analysed with, by name: the page's model, the
    class-attention galleries' props and look, the talking-heads layer."""

    choice: Any  # the session's ModelChoice
    ca_props: tuple
    cmap: str
    alpha: float
    scale: str
    view: str
    keep: float
    th_layer: int

    @property
    def look(self) -> Look:
        return Look(self.cmap, self.alpha, self.scale, self.view, self.keep)


def named(parts: Any, ask: type, **more: Any) -> dict[str, Any]:
    """The components the fields of the dataclass `ask` are named after, found in `parts` (one components
    dataclass, or several in a tuple) and `more`: an event's `inputs_kwargs`, so that its handler gets each value
    as the keyword of that name; a field named as a dict of components (e.g. the method options' controls) stands
    for each of them, by its own name."""
    found = dict(more)
    for group in parts if isinstance(parts, tuple) else (parts,):
        found.update({f.name: getattr(group, f.name) for f in fields(group)})
    named = [found[f.name] if isinstance(found[f.name], dict) else {f.name: found[f.name]} for f in fields(ask)]
    return {name: component for some in named for name, component in some.items()}


def answering(fn: Callable, *, said: Callable[[str], Any] | None = None) -> Callable:
    """`fn` as an event handler whose errors come in two kinds: a user's (`cait.InputError`) shown as its own calm
    line, anything else as one line saying that an internal error happened, with the traceback in the server log.
    said(line): the handler's answer for that line (default: a Gradio error toast of it)."""

    def line_of(e: Exception) -> Any:
        if isinstance(e, InputError):
            log.info("%s: %s", fn.__name__, e)
            text = str(e).splitlines()[0] if str(e) else type(e).__name__
        else:
            log.exception("internal error in %s", fn.__name__)
            text = INTERNAL_ERROR
        if said is None:
            raise gr.Error(text.replace("**", ""), print_exception=False) from None
        return said(text)

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def steps(*args: Any, **kwargs: Any):
            try:
                yield from fn(*args, **kwargs)
            except gr.Error:
                raise
            except Exception as e:  # noqa: BLE001 - the two kinds are told apart in line_of
                yield line_of(e)

        return steps

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as e:  # noqa: BLE001 - the two kinds are told apart in line_of
            return line_of(e)

    return body


# What a new image (and the talking-heads query) sends with `preprocess=False` (`NO_BOUNDS_CHECK`): Gradio checks a
# control's value against the bounds and choices the server last sent the page, so after a model swap a value
# the page sent before the swap's new bounds reached it (a larger model's query patch, layer or map) was refused
# before any handler ran ("Value 9 is greater than maximum value 7"); its handler takes it at the door instead,
# clamped to the page's model (`within`) or left out
NO_BOUNDS_CHECK = dict(preprocess=False)


def within(value: Any, high: int, default: int) -> int:
    """A slider's value as the page sent it, as a whole number in 1..high (`default` for one that is not a finite
    number): what a handler takes of a slider whose bounds follow the page's model (`NO_BOUNDS_CHECK`)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    return min(max(round(number), 1), high) if math.isfinite(number) else default


SCALES = ("per tile", "shared per layer")  # the class-attention colour scale (the Class attention tab's control)
VIEWS = ("smooth", "patch grid")  # how a heat map is drawn (the Class attention tab's control, read by Saliency)


@dataclass(frozen=True)
class Look:
    """How class attention is drawn: the Class attention tab's controls, which the follow-up reads too."""

    cmap: str
    alpha: float
    scale: str
    view: str
    keep: float

    def tile_args(self) -> dict[str, Any]:
        """As `cait.figures.attention_tile` arguments."""
        return dict(
            cmap=self.cmap,
            alpha=float(self.alpha),
            shared_scale=self.scale == SCALES[1],
            smooth=self.view == VIEWS[0],
            keep_mass=float(self.keep),
        )
