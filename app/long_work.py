"""One runner for a page's long work (the Causal tab's views and knockout profiles, the Mechanisms tab's patching
runs, an atlas build, a compare run): its Stop button armed when the work is asked for (`LongWork.asked`, off the
queues), the page's Stop held while the work runs (`app.stops`), the work on the long lane with its progress
(`app.torch_thread.call_long`), and the one line said when it ended without its answer (`Ended`: stopped, cancelled
by the page's next image, or refused in a user's words)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import gradio as gr

from app import texts, torch_thread
from app.shared import LONG_EVENTS
from app.stops import Held, PageStops, Stopped, page_of
from cait.errors import InputError

if TYPE_CHECKING:
    import torch

log = logging.getLogger("cait.app")
T = TypeVar("T")
OFF_QUEUE = dict(queue=False, api_visibility="private")  # must get through while the work holds the queues


@dataclass(frozen=True)
class Ended:
    """Long work that ended without its answer: the line its page shows instead ("" when the page's next image
    cancelled it: that image's first view emptied the tab)."""

    line: str
    cancelled: bool = False


def first_line(e: Exception) -> str:
    """What an error says, in one line (its type's name when it says nothing)."""
    return (str(e).splitlines() or [type(e).__name__])[0]


def did_not_finish(what: str, again: str) -> str:
    """The Stopped line of work that keeps nothing of its own: `what` did not finish, and how to ask `again`."""
    return f"**Stopped:** {what} did not finish; {again}"


def scenes_done(out: Path, n: int, again: str) -> str:
    """The Stopped line of a build over `n` scenes into `out`: the scenes its shards hold, kept where building it
    `again` continues from."""
    from cait.atlas.shards import shard_files  # torch-heavy: only once a build stopped

    done = sum(len(rows) for rows in shard_files(out))
    return f"**Stopped** with {done:,} of {n:,} scenes done (kept in `{out}`); {again} to continue."


class LongWork(PageStops):
    """The long work of one Stop `button`, per page: what arms the Stop, holds it and runs the work."""

    def __init__(self, button: gr.Button) -> None:
        super().__init__()
        self.button = button

    def arm_if(self, asks: bool, request: gr.Request | None) -> dict:
        """Work asked for (`asks`: armed, `PageStops.arm`) or not: the Stop, enabled while work of the page is
        asked for or runs."""
        if asks:
            self.arm(request)
        return {self.button: gr.Button(interactive=asks or self.running(request))}

    def asked(self, request: gr.Request | None = None) -> dict:
        """Work asked for (at once, off the queues): armed (a Stop pressed from now on stops it, even while it
        waits for the long lane), and the page's Stop enabled."""
        return self.arm_if(True, request)

    def ended(self, request: gr.Request | None = None) -> dict:
        """Work ended (finished, failed or stopped): the Stop disabled unless other work of the page has not."""
        return self._disabled_unless(self.running(request))

    def _disabled_unless(self, still_needed: bool) -> dict:
        """What work that ended writes of the Stop: disabled when it was the page's last one, else nothing. Never
        "enabled": the answers of two computations may reach the page in either order, and the one that ended
        first must not enable the Stop after the last one disabled it."""
        return {} if still_needed else {self.button: gr.Button(interactive=False)}

    def answered(self, request: gr.Request | None, compute: Callable[[Held], dict | None]) -> dict:
        """compute(held) holding the page's Stop until it returns or raises: its answer, with the Stop disabled
        when it was the page's last work to end; only that Stop when it has nothing to show (None)."""
        with self.holding(request) as held:
            out = compute(held)
        return (out or {}) | self._disabled_unless(held.still_needed) or gr.skip()

    @staticmethod
    def moved_on(request: gr.Request | None = None) -> None:
        """An image picked or uploaded (at once, off the queues, before its analysis): the page's long work of its
        last image is cancelled. At the pick, not later in the new image's event chain: by then the user may have
        opened a tab, and its work on the new image must not be cancelled."""
        torch_thread.cancel_long(page_of(request))

    def run(self, work: Callable[[], T], *, held: Held, what: str, stopped: Callable[[], str],
            model: torch.nn.Module | None = None, progress: texts.ProgressLine | None = None, of_image: bool = True,
            refused: str | None = None, stopped_by: tuple[type[Exception], ...] = ()) -> T | Ended:  # fmt: skip
        """work() on the long lane, the page's Stop (`held`) heard while it waits for the lane, when it starts and
        before each block of `model` (`torch_thread.call_long`): its answer, or `Ended` with the line said instead.
        what: the work, for the log; stopped(): the line once the Stop ended it (or one of `stopped_by`, raised by
        the work itself); progress: the work's progress line, which says while the work waits (None: nothing said);
        of_image: the page's next image cancels it; refused: the line's start for a user's error (`InputError`)
        or a file's (`OSError`), then its first line (None: those are raised)."""
        on_wait = progress.waiting if progress is not None else None
        page = held.page if of_image else None
        try:
            return torch_thread.call_long(
                work, page=page, model=model, stop=lambda: held.stop_if_pressed(what), on_wait=on_wait
            )
        except torch_thread.Cancelled:
            log.info("%s cancelled by its page's next image", what)
            return Ended("", cancelled=True)
        except (Stopped, *stopped_by):
            log.info("%s stopped by its page", what)
            return Ended(stopped())
        except (InputError, OSError) as e:
            if refused is None:
                raise
            log.info("%s refused: %s", what, first_line(e))
            return Ended(f"**{refused}:** {first_line(e)}")

    def wire_stop(self, demo: gr.Blocks) -> None:
        """The Stop button stops the page's work asked before it; a closed page's Stop goes with it. Every press is
        sent: Gradio's default for a click ("once") drops a press while the page's last press is unanswered, and
        work asked in between would then run on."""
        self.button.click(self.press, None, None, trigger_mode="multiple", **OFF_QUEUE)
        demo.unload(self.drop)

    def wire(self, demo: gr.Blocks, ask: Callable, fn: Callable, *, hidden: bool = False, **event: Any) -> None:
        """A control's event `ask` (e.g. a button's click) asks for the work: armed and its Stop enabled at once,
        off the queues, then fn on the long lane's queue (with `event`'s settings), then the Stop's state;
        `hidden`: no progress shown on the Stop while it is armed and ended."""
        quiet = dict(OFF_QUEUE, show_progress="hidden") if hidden else OFF_QUEUE
        ran = ask(self.asked, None, self.button, **quiet).then(fn, **event, **LONG_EVENTS)
        ran.then(self.ended, None, self.button, **quiet)
        self.wire_stop(demo)
