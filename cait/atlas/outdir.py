"""The atlas's output folder locked before any work (`cait.outputs` proves it writable), so that a second run into the
same --out is refused in one line instead of computing every shard again and racing the first one's merge."""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock, Timeout

from ..outputs import OutputError

LOCK_FILE = ".atlas.lock"


def lock_out(out: Path, *, what: str = "atlas") -> FileLock:
    """OUT's lock, held: every file under OUT is written by one run at a time. Raises OutputError at once when
    another run holds it, naming the run as `what` (an atlas, a comparison: `cait.compare` shares this folder's
    machinery)."""
    lock = FileLock(out / LOCK_FILE)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise OutputError(
            f"another {what} run is writing to {out}: wait for it to finish, or use another --out"
        ) from None
    except OSError as e:
        raise OutputError(f"cannot lock {out / LOCK_FILE}: {e.strerror or type(e).__name__}") from None
    return lock
