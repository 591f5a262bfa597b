"""Shared fixtures: timm's CaiT (the independent oracle) with the same random weights as ours; a
session-wide scene cache directory, so tests never write into the user's cache."""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

# No test reaches the Hugging Face Hub or sees the user's own cache: huggingface_hub (imported by timm)
# reads these once, at import, so they are set before anything imports it; subprocesses inherit them.
# tests/test_hub.py serves a stand-in Hub on 127.0.0.1 instead.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="cait-tests-hf-")
atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)
for _var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ENDPOINT"):
    os.environ.pop(_var, None)
# Each of pytest-xdist's workers (pyproject's addopts) computes with one OpenMP thread: two workers of two threads
# each on two cores would spin against each other. Set before torch is imported; subprocesses inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import cait  # noqa: E402
from cait.config import CaiTConfig  # noqa: E402
from cait.reference import timm_cait  # noqa: E402
from cait.runtime import CACHE_ENV  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def scene_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("scene_cache")
        mp.setenv(CACHE_ENV, str(path))
        yield path


@torch.no_grad()
def randomise_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights that exercise every path: LayerScale gammas far from their tiny init, talking-heads mixing
    far from zero, linear weights at 1/sqrt(fan_in) so attention is not near uniform."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        if name.endswith(("gamma_1", "gamma_2")):
            p.copy_(0.05 + 0.25 * noise.abs())
        elif "norm" in name and name.endswith("weight"):
            p.copy_(1 + 0.1 * noise)
        elif p.dim() >= 2 and name not in ("pos_embed", "cls_token"):
            p.copy_(noise / p[0].numel() ** 0.5)  # fan-in scaling (also for the conv and proj_l/proj_w)
        else:
            p.copy_(0.1 * noise)
    return model


@pytest.fixture(scope="session")
def twins():
    """twins(name_or_cfg, seed=0) -> (ours, timm's), eval mode, the same random weights loaded into both.
    Built once per session (xxs24 takes seconds to build on a busy CPU): tests must not modify them."""
    cache: dict = {}

    def make(spec: str | CaiTConfig, seed: int = 0):
        cfg = cait.get_config(spec) if isinstance(spec, str) else spec
        if (cfg, seed) not in cache:
            # Both inits are overwritten anyway, so build on meta and skip them.
            with torch.device("meta"):
                theirs, ours = timm_cait(cfg), cait.CaiT(cfg)
            theirs = randomise_(theirs.to_empty(device="cpu"), seed).eval()
            ours = ours.to_empty(device="cpu").eval()
            ours.load_state_dict(theirs.state_dict(), strict=True)
            cache[(cfg, seed)] = ours, theirs
        return cache[(cfg, seed)]

    return make


@pytest.fixture
def hf_env(tmp_path, monkeypatch):
    """hf_env(endpoint, offline=False) -> the hub cache dir: HF_ENDPOINT, HF_HUB_OFFLINE and HF_HOME (in
    tmp_path) set as a user sets them, then huggingface_hub.constants reloaded, so that the client reads
    them as it does at import. With tests/stand_in_hub.py's StandInHub as the endpoint."""
    from huggingface_hub import constants

    def set_env(endpoint: str, *, offline: bool = False) -> Path:
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
        importlib.reload(constants)
        return tmp_path / "hf" / "hub"

    yield set_env
    monkeypatch.undo()
    importlib.reload(constants)


PICO_SCENES = 150  # how many exported scenes `pico_scenes` holds (plus one broken file)


@pytest.fixture(scope="session")
def pico_scenes(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, folder): a random cait_pico_32 saved as safetensors, and 150 test scenes exported as an
    ImageFolder with COCO boxes plus one broken file: the user's-data setup the atlas and evaluate tests share."""
    from cait.checkpoint import save_weights
    from cait.data.export import export_scenes

    root = tmp_path_factory.mktemp("pico_scenes")
    save_weights(
        randomise_(cait.load_model("cait_pico_32", weights=False).model, seed=3).eval(), root / "pico.safetensors"
    )
    export_scenes(root / "scenes", n=PICO_SCENES, split="val", style="default", seed=0)
    (root / "scenes" / "Bag" / "broken.png").write_text("not an image")
    return root / "pico.safetensors", root / "scenes"


@pytest.fixture
def unwritable(tmp_path, monkeypatch):
    """unwritable(module, name) -> {what: path}: places a command cannot write an output to (a file, a path below a
    file, one in /proc, a folder where a file is wanted), with module.name, the command's first costly step, made
    to fail the test if it runs: a command refuses such an output before any work."""
    a_file, a_folder = tmp_path / "a_file", tmp_path / "a_folder"
    a_file.write_text("")
    a_folder.mkdir()

    def arm(module: object, name: str) -> dict[str, Path]:
        def no_work(*args, **kwargs):
            raise AssertionError(f"{name} ran before the output was checked")

        monkeypatch.setattr(module, name, no_work)
        return {"file": a_file, "below a file": a_file / "below", "proc": Path("/proc/cait-out"), "folder": a_folder}

    return arm


def one_error_line(err: str, *, progress: str) -> str:
    """A command's one error line on stderr, besides its progress bar's (lines starting with `progress`)."""
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and not line.startswith(progress)]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def wait_until_served(proc: subprocess.Popen, url: str, log: Path, *, within: float = 300) -> None:
    """Return once `url` answers; fail with the end of `log` when `proc` exits first or `within` seconds pass."""
    deadline = time.time() + within
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    proc.kill()
    proc.wait()
    raise AssertionError(f"the page was not served within {within:.0f} s:\n{log.read_text()[-3000:]}")


def killed_after_first_shard(command: list[str], out: Path, *, cwd: Path, env: dict) -> dict[str, int]:
    """Start a sharded command (the atlas, a comparison), SIGKILL it as soon as OUT/shards/ holds a shard, and
    return the shard files left, by name, with their modification times (to tell the kept from the redone)."""
    import signal

    proc = subprocess.Popen(command, cwd=cwd, env=env, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not list((out / "shards").glob("*.npz")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return {p.name: p.stat().st_mtime_ns for p in (out / "shards").glob("*.npz")}
