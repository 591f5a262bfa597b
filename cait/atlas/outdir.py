"""The atlas's output folder before any work: made, proved writable, and locked, so that a second run into the
same --out is refused in one line instead of computing every shard again and racing the first one's merge."""

from __future__ import annotations

import os
from pathlib import Path

from filelock import FileLock, Timeout

LOCK_FILE = ".atlas.lock"


class OutputError(OSError):
    """An output folder that cannot be used; the message is one line."""


def writable_folder(folder: Path) -> None:
    """Make `folder` (and its parents) and prove a file can be written and removed there. Raises OutputError in
    one line otherwise: before the work, not after it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}.tmp"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise OutputError(f"cannot write to {folder}: {e.strerror or type(e).__name__}") from None


def lock_out(out: Path) -> FileLock:
    """OUT's lock, held: every file under OUT is written by one run at a time. Raises OutputError at once when
    another run holds it."""
    lock = FileLock(out / LOCK_FILE)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise OutputError(
            f"another atlas run is writing to {out}: wait for it to finish, or use another --out"
        ) from None
    except OSError as e:
        raise OutputError(f"cannot lock {out / LOCK_FILE}: {e.strerror or type(e).__name__}") from None
    return lock
