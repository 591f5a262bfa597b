"""The app as `app/main.py` serves it, with one gate for the browser tests of the Compare tab: a compare build
waits, before its third batch (two batches done, one shard written), until the file named by CAIT_GATE_OPEN
exists, after writing the file named by CAIT_GATE_REACHED. The test opens the gate: it never races the build.

    CAIT_GATE_REACHED=R CAIT_GATE_OPEN=O python tests/compare_gate_app.py [app/main.py's flags]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cait.compare  # noqa: E402
from app.main import main  # noqa: E402

HELD_BEFORE = 3  # the should_stop call the build waits at: before its third batch
GATE_TIMEOUT_S = 300  # a test that never opens the gate leaves the build stuck this long at most

_run_compare = cait.compare.run_compare


def gated_run_compare(options, *, should_stop=None, **kwargs):
    """`run_compare`, held at the gate before its third batch."""
    calls = 0

    def held() -> bool:
        nonlocal calls
        calls += 1
        if calls == HELD_BEFORE:
            Path(os.environ["CAIT_GATE_REACHED"]).touch()
            deadline = time.monotonic() + GATE_TIMEOUT_S
            while not Path(os.environ["CAIT_GATE_OPEN"]).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return bool(should_stop and should_stop())

    return _run_compare(options, should_stop=held, **kwargs)


cait.compare.run_compare = gated_run_compare

if __name__ == "__main__":
    sys.exit(main())
