"""Outputs a command writes, checked before it computes: the folder (or a file's folder) is made and proved
writable at once, so a run never spends its work and then fails at the end on a read-only path."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import InputError


class OutputError(InputError):
    """An output path that cannot be written; the message is one line."""


def writable_folder(folder: Path) -> None:
    """Make `folder` (and its parents) and prove a file can be written and removed there.

    Args:
        folder: the output folder.

    Raises OutputError in one line when it cannot be made or written to."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}.tmp"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise OutputError(f"cannot write to {folder}: {e.strerror or type(e).__name__}") from None


def writable_file(path: Path) -> None:
    """Prove that `path` can be written (its folder is made, then probed; `path` itself is not touched).

    Args:
        path: the output file.

    Raises OutputError in one line for a directory in its place or a folder that cannot be written."""
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is a directory")
    writable_folder(path.parent)


def write_failure(e: OSError) -> str:
    """A file-system error as one line naming the file."""
    if e.strerror is None:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"cannot write {e.filename}: {e.strerror}" if e.filename else e.strerror
