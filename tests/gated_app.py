"""`python tests/gated_app.py GATE HOLDS [app/main.py's arguments]`: the app with a gate its browser tests close and
open, so that a test needing long work "still running" (to see its progress, to press its Stop, to start something
beside it) holds it there instead of racing the browser against the model.

The gate is closed while the file GATE exists. HOLDS names, comma-separated, the work that waits there (`HOLDS`):
`causal`, the Causal tab's knockouts (the view's and a branch's profile), and `mechanisms`, the Mechanisms tab's
patching runs, wait after each progress step they report, as if the next block took until the test opens the gate
(removes the file); the wait is `app.torch_thread.stoppable`'s, so a page's Stop and its next image end the run
there as they would between two blocks. `compare`: a compare build waits before its third batch (two batches done,
one shard written), then asks its Stop as it would there. Work that waits at the closed gate first writes the file
`reached(GATE)`, so a test knows it got there. Without the file GATE, the app runs as it is."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's `app`, as app/main.py does

import cait.compare  # noqa: E402
from app import causal_view, main, mechanisms_view, torch_thread  # noqa: E402

COMPARE_HELD_BEFORE = 3  # the compare build's should_stop call that waits at the gate: before its third batch


def reached(gate: Path) -> Path:
    """The file that work waiting at the closed `gate` writes."""
    return gate.with_name(gate.name + ".reached")


def wait_at(gate: Path) -> None:
    """Return once `gate` is open (its file gone), having written `reached(gate)` if it was closed."""
    if gate.exists():
        reached(gate).touch()
    while gate.exists():
        time.sleep(0.05)


def _held(report: Callable[[int, int], None] | None, gate: Path) -> Callable[[int, int], None]:
    """`report`, then a wait (heard by a Stop or the page's next image) while the gate is closed."""

    def step(done: int, total: int) -> None:
        if report is not None:
            report(done, total)
        torch_thread.stoppable(lambda: wait_at(gate))

    return step


def _hold_causal(gate: Path) -> None:
    for name in ("compute", "branch_knockout"):
        original = getattr(causal_view, name)

        @wraps(original)
        def gated(*args, on_block=None, _original=original, **kwargs):
            return _original(*args, on_block=_held(on_block, gate), **kwargs)

        setattr(causal_view, name, gated)


def _hold_mechanisms(gate: Path) -> None:
    counted_runs = mechanisms_view.counted_runs

    @contextmanager
    def gated_runs(model, total, *, report, check):
        with counted_runs(model, total, report=_held(report, gate), check=check):
            yield

    mechanisms_view.counted_runs = gated_runs


def _hold_compare(gate: Path) -> None:
    run_compare = cait.compare.run_compare

    @wraps(run_compare)
    def gated_run_compare(options, *, should_stop=None, **kwargs):
        calls = 0

        def held() -> bool:
            nonlocal calls
            calls += 1
            if calls == COMPARE_HELD_BEFORE:
                wait_at(gate)
            return bool(should_stop and should_stop())

        return run_compare(options, should_stop=held, **kwargs)

    cait.compare.run_compare = gated_run_compare


HOLDS = {"causal": _hold_causal, "mechanisms": _hold_mechanisms, "compare": _hold_compare}


def install(gate: Path, holds: list[str]) -> None:
    """Hold the work named in `holds` (keys of `HOLDS`) while `gate` exists."""
    for name in holds:
        HOLDS[name](gate)


if __name__ == "__main__":
    install(Path(sys.argv[1]), sys.argv[2].split(","))
    sys.exit(main.main(sys.argv[3:]))
