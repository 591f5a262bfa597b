"""A run killed while the scene cache renders leaves nothing behind: its render workers (and Python's resource
tracker) end with it, and its temporary file is removed by the next start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cait.data import FashionMNISTScenes
from cait.data.scene_cache import cached_pixels
from cait.runtime import CACHE_ENV

REPO = Path(__file__).resolve().parent.parent
# two render processes whatever the size (PARALLEL_FROM is the parent's choice), chunks small enough that the
# kill lands while the workers are busy
RENDER = """
import cait.data.scene_cache as c
from cait.data import FashionMNISTScenes
c.PARALLEL_FROM, c.CHUNK = 0, 20
c.cached_pixels(FashionMNISTScenes("val", subset=2000), processes=2)
"""


def descendants(pid: int) -> set[int]:
    """Every process below `pid`, from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_killed_render_leaves_no_worker_and_no_temporary_file(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    env = {**os.environ, CACHE_ENV: str(cache), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", RENDER], env=env, stderr=subprocess.DEVNULL)
    deadline, workers = time.time() + 120, set()
    while len(workers) < 3 and proc.poll() is None and time.time() < deadline:  # two workers, one tracker
        time.sleep(0.2)
        workers = descendants(proc.pid)
    assert proc.poll() is None and len(workers) >= 3, "the render did not start its workers"
    time.sleep(1.0)  # the workers are rendering
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 60  # a worker still importing torch on a busy machine checks once it is up
    while any(alive(p) for p in workers) and time.time() < deadline:
        time.sleep(0.2)
    left = [p for p in workers if alive(p)]
    said = [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left]
    for p in left:  # do not leave them to the rest of the suite
        os.kill(p, signal.SIGKILL)
    assert not left, f"{len(left)} process(es) outlived the killed render: {said}"
    assert len(list(cache.glob("*.npy.tmp*"))) == 1  # the killed build's
    monkeypatch.setenv(CACHE_ENV, str(cache))
    cached_pixels(FashionMNISTScenes("val", subset=8))  # the next start, of any scenes
    assert list(cache.glob("*.npy.tmp*")) == []
