"""`python tests/gated_app.py GATE [app/main.py's arguments]`: the app with a gate its browser tests close and open,
so that a test needing a long run "still running" (to see its progress, to press its Stop, to start something
beside it) holds it there instead of racing the browser against the model.

While the file GATE exists the gate is closed: the Causal tab's knockouts (the view's and a branch's profile) and
the Mechanisms tab's patching runs wait after each progress step they report, as if the next block took until the
test opens the gate (removes the file). The wait is `app.torch_thread.stoppable`'s, so a page's Stop and its next
image end the run there as they would between two blocks. Without the file, the app runs as it is."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's `app`, as app/main.py does

from app import causal_view, main, mechanisms_view, torch_thread  # noqa: E402


def _held(report: Callable[[int, int], None] | None, gate: Path) -> Callable[[int, int], None]:
    """`report`, then a wait (heard by a Stop or the page's next image) while the gate is closed."""

    def wait_for_the_gate() -> None:
        while gate.exists():
            time.sleep(0.05)

    def step(done: int, total: int) -> None:
        if report is not None:
            report(done, total)
        torch_thread.stoppable(wait_for_the_gate)

    return step


def install(gate: Path) -> None:
    """Hold the Causal tab's knockouts and the Mechanisms tab's patching runs while `gate` exists."""
    for name in ("compute", "branch_knockout"):
        original = getattr(causal_view, name)

        @wraps(original)
        def gated(*args, on_block=None, _original=original, **kwargs):
            return _original(*args, on_block=_held(on_block, gate), **kwargs)

        setattr(causal_view, name, gated)
    counted_runs = mechanisms_view.counted_runs

    @contextmanager
    def gated_runs(model, total, *, report, check):
        with counted_runs(model, total, report=_held(report, gate), check=check):
            yield

    mechanisms_view.counted_runs = gated_runs


if __name__ == "__main__":
    install(Path(sys.argv[1]))
    sys.exit(main.main(sys.argv[2:]))
