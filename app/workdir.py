"""The app's own temporary folder: made on first use (importing the app creates nothing), removed when
the process exits; per-request download folders inside it are swept after FILE_TTL seconds. What the app makes
for the user to keep (atlases built in the Dataset tab) goes to the user cache instead (`kept`)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from cait.runtime import user_cache_dir

FILE_TTL = 900  # seconds our download files are kept (Gradio copies them into its own cache)


class WorkDir:
    def __init__(self, prefix: str = "cait-app-"):
        self._prefix, self._path = prefix, None
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        with self._lock:
            if self._path is None:
                self._path = Path(tempfile.mkdtemp(prefix=self._prefix))
                atexit.register(self.cleanup)
            return self._path

    def cleanup(self) -> None:
        with self._lock:
            if self._path is not None:
                shutil.rmtree(self._path, ignore_errors=True)
                self._path = None

    def folder(self, name: str) -> Path:
        """A named sub-folder (e.g. generated example images), created if needed."""
        path = self.path / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def request_dir(self) -> Path:
        """A fresh folder for one request's downloads (no two requests share a file); old ones are swept."""
        root = self.folder("requests")
        cutoff = time.time() - FILE_TTL
        for old in root.iterdir():
            try:
                if old.stat().st_mtime < cutoff:
                    shutil.rmtree(old, ignore_errors=True)
            except FileNotFoundError:  # swept by a concurrent request
                pass
        return Path(tempfile.mkdtemp(dir=root))


def own_gradio_cache() -> Path:
    """Makes this process's Gradio cache (uploads, the files outputs are served from) a folder of WORK, unless
    $GRADIO_TEMP_DIR names one; returns the cache folder. Gradio's default is one folder for every app on the
    machine, named by file content, and an app deletes the files it made when it stops: another app's page
    showing the same image (an example) was then refused it."""
    return Path(os.environ.setdefault("GRADIO_TEMP_DIR", str(WORK.folder("gradio"))))


def kept(name: str) -> Path:
    """A folder of what the app makes for the user to keep after it exits (`cait.runtime.user_cache_dir()`/name:
    $CAIT_LENS_CACHE, else the user's cache), created if needed."""
    path = user_cache_dir() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


WORK = WorkDir()  # the app's one folder; nothing is created until something asks for its path
