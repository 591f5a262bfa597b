"""The server as a user starts it (`python app/main.py`): every refused /analyze call, malformed or not, is one
line in the log and one line to the client, never a traceback; SIGINT and SIGTERM end it within seconds while the
model computes, its temporary folder removed; the page is served before bf16 is timed, and says the precision
that runs once it is decided."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import wait_until_served
from test_app import ROOT, free_port

import cait
from app.api import Analyze
from app.tabs.dataset import BUILT
from app.workdir import kept

SCENE = sorted(cait.data.EXAMPLES_DIR.glob("scene_*.png"))[0]
STOP_BOUND_S = 20  # generous: the shutdown's own grace is 5 s; today a running computation held it for minutes


def start(args: list[str], log: Path, *, tmp: Path, code: str | None = None, within: float = 300):
    """`python app/main.py ARGS` (or `python -c CODE`, which runs it) on a free port, its temporary files in
    `tmp`; returns (process, url) once the page answers."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    argv = ["--port", str(port), "--device", "cpu", *args]
    command = [sys.executable, "-c", code, *argv] if code else [sys.executable, str(ROOT / "app" / "main.py"), *argv]
    proc = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}/"
    wait_until_served(proc, url, log, within=within)
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    log = tmp / "server.log"
    proc, url = start(["--model", "cait_nano_64", "--random-init"], log, tmp=tmp)
    try:
        yield url, log
    finally:
        stop(proc)


def raw_call(url: str, data: object) -> tuple[str, dict | list | None]:
    """POST /gradio_api/call/analyze as any HTTP client may, then its answer: ("complete" | "error", payload)."""
    api = f"{url}gradio_api"
    posted = httpx.post(f"{api}/call/analyze", json={"data": data}, timeout=30)
    posted.raise_for_status()
    answer = httpx.get(f"{api}/call/analyze/{posted.json()['event_id']}", timeout=120).text
    event = next(line.split(": ", 1)[1] for line in answer.splitlines() if line.startswith("event: "))
    payload = next(line.split(": ", 1)[1] for line in answer.splitlines() if line.startswith("data: "))
    return event, json.loads(payload)


def uploaded(url: str, path: Path) -> dict:
    with path.open("rb") as f:
        name = httpx.post(f"{url}gradio_api/upload", files={"files": f}, timeout=30).json()[0]
    return {"path": name, "meta": {"_type": "gradio.FileData"}}


# /analyze's inputs after the image, with their defaults, as the endpoint publishes them
OPTIONS = {n: p.default for n, p in list(inspect.signature(Analyze(None, None).published()).parameters.items())[1:]}
INPUTS = 1 + len(OPTIONS)
IMAGE = object()  # stands for a file uploaded as gradio_client does


def with_inputs(**given) -> list:
    image = given.pop("image", IMAGE)
    return [image, *(given.get(name, default) for name, default in OPTIONS.items())]


MALFORMED = {
    "the image alone": ([IMAGE], f"/analyze takes {INPUTS} inputs (image, method, target"),
    "no inputs": ([], f"takes {INPUTS} inputs"),
    "one too many": ([*with_inputs(), "extra"], f"got {INPUTS + 1}"),
    "a word for a count": (with_inputs(ig_steps="many"), "ig_steps must be a whole number, got 'many'"),
    "a list for the class": (with_inputs(method="saliency", target=[1]), "target must be a whole number, got [1]"),
    "true for the class": (with_inputs(target=True), "target must be a whole number, got True"),
    "a word for a switch": (with_inputs(causal="yes"), "causal must be true or false, got 'yes'"),
    "a number for the method": (with_inputs(method=3), "method must be a string, got 3"),
    "a path for the image": (with_inputs(image="/etc/hostname"), "image must be a file uploaded to this server"),
    "a file without its type": (with_inputs(image={"path": "/etc/hostname"}), "image must be a file uploaded"),
    "a file not uploaded": (
        with_inputs(image={"path": "/etc/hostname", "meta": {"_type": "gradio.FileData"}}),
        "the file was refused: Cannot move /etc/hostname",
    ),
    "a URL Gradio will not fetch": (
        with_inputs(image={"path": "http://127.0.0.1:9/x.png", "meta": {"_type": "gradio.FileData"}}),
        "the file was refused: Hostname 127.0.0.1 failed validation",
    ),
    "no SmoothGrad samples (N50)": (
        with_inputs(method="smoothgrad", smoothgrad_samples=0),
        "smoothgrad_samples must be between 2 and 64, got 0",
    ),
    "a seed torch cannot take (issue 59)": (with_inputs(seed=2**70), "seed must be a whole number from -2**63"),
    "a 100,000-character method, echoed cut": (with_inputs(method="x" * 100_000), f"unknown method '{'x' * 76}...;"),
}


def test_every_refused_call_is_one_line_in_the_log_and_one_to_the_client(server):
    """Malformed raw calls (too few or too many inputs, wrong types, files the server did not receive) and a
    bad option value: each answered with one line naming what is wrong, each logged as one line, no traceback;
    a good call after them is answered."""
    url, log = server
    image = uploaded(url, SCENE)
    before = log.read_text()
    for what, (data, message) in MALFORMED.items():
        event, payload = raw_call(url, [image if value is IMAGE else value for value in data])
        assert event == "error" and message in payload["error"], (what, payload)
        assert "\n" not in payload["error"], what
    said = log.read_text()[len(before) :]
    assert "Traceback" not in said and "Error" not in said, said
    refused = [line for line in said.splitlines() if "/analyze refused: " in line]
    assert len(refused) == len(MALFORMED) and max(map(len, refused)) < 1000, said
    event, payload = raw_call(url, with_inputs(image=image))
    assert event == "complete" and payload[0]["predictions"][0]["label"] in cait.config.FASHION_MNIST_CLASSES


def test_the_app_keeps_its_own_gradio_cache(server):
    """Uploads and served files go to the app's own work folder, not the one Gradio folder every app on the
    machine shares (an app deletes its files there when it stops, the same files another app serves)."""
    url, _ = server
    folder = Path(uploaded(url, SCENE)["path"]).parent.parent
    assert folder.name == "gradio" and folder.parent.name.startswith("cait-app-"), folder


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_the_server_promptly_while_it_computes(tmp_path, signum):
    """Ctrl+C (or a service manager's SIGTERM) while a long /analyze runs on the torch thread: the process ends
    within the bound, with status 0, its temporary folder removed; the running computation is not waited for."""
    from gradio_client import Client, handle_file
    from gradio_client.utils import Status

    log = tmp_path / "server.log"
    proc, url = start(["--model", "cait_micro_136", "--random-init"], log, tmp=tmp_path)
    try:
        assert list(tmp_path.glob("cait-app-*")), "the app's temporary folder is made at start"
        long = dict(method="integrated_gradients", ig_steps=128, causal=True, patching="gaussian_noise:3")
        job = Client(url, verbose=False).submit(handle_file(str(SCENE)), **long, api_name="/analyze")
        deadline = time.monotonic() + 60
        while job.status().code != Status.PROCESSING and time.monotonic() < deadline:
            time.sleep(0.1)  # the call has reached the handler (on a loaded machine, not within a fixed time)
        time.sleep(1)  # the computation has started on the torch thread
        assert not job.done()
        asked = time.monotonic()
        proc.send_signal(signum)
        try:
            proc.wait(timeout=STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {STOP_BOUND_S} s after {signum.name}:\n{log.read_text()[-2000:]}")
        took = time.monotonic() - asked
        assert proc.returncode == 0, log.read_text()[-2000:]
        with pytest.raises(Exception, match="The server is stopping"):  # the caller is told why (issue 59)
            job.result(timeout=30)
        assert not list(tmp_path.glob("cait-app-*")), "the app's temporary folder is left behind"
        assert f"stopping on {signum.name}" in log.read_text() and "Traceback" not in log.read_text()
        print(f"{signum.name}: ended {took:.1f} s after the signal")
    finally:
        stop(proc)


# `python app/main.py` with a CPU that claims bf16 instructions and a bf16 timing that takes as long as the test
# wants: it returns 2.0 (bf16 twice as fast) once the file named by RELEASE exists
SLOW_PROBE = """
import os, sys, time, pathlib
import torch
import cait.runtime as runtime
torch.cpu._is_avx512_bf16_supported = lambda: True
def timed():
    while not pathlib.Path(os.environ["RELEASE"]).exists():
        time.sleep(0.2)
    return 2.0
runtime.cpu_bf16_speedup = timed
sys.argv[0] = "app/main.py"
from app.main import main
sys.exit(main(sys.argv[1:]))
"""


def header(url: str) -> str:
    config = httpx.get(f"{url}config", timeout=30).json()
    return next(c["props"]["value"] for c in config["components"] if c["props"].get("elem_id") == "header")


def test_the_page_is_served_before_bf16_is_timed(tmp_path, monkeypatch):
    """A start that must time bf16 (none stored: a fresh cache dir) serves the page in fp32 while the timing runs,
    saying so; once timed, every model runs in the precision chosen and the page a browser opens says it."""
    release = tmp_path / "release"
    monkeypatch.setenv("RELEASE", str(release))
    monkeypatch.setenv("CAIT_LENS_CACHE", str(tmp_path / "cache"))
    log = tmp_path / "server.log"
    proc, url = start(["--model", "cait_nano_64", "--random-init"], log, tmp=tmp_path, code=SLOW_PROBE, within=150)
    try:
        assert "fp32, until bf16, timed in the background, decides" in header(url)
        assert "forward-only passes in" not in log.read_text()  # not decided yet
        release.touch()
        deadline = time.time() + 120
        while "bf16 autocast, measured now" not in header(url) and time.time() < deadline:
            time.sleep(0.5)
        assert "bf16 autocast, measured now" in header(url)
        assert "forward-only passes in bf16, measured now" in log.read_text()
        stored = json.loads((tmp_path / "cache" / "precision.json").read_text())
        assert [entry["bf16_speedup"] for entry in stored.values()] == [2.0]
    finally:
        stop(proc)


def test_an_atlas_built_in_the_app_is_served(server):
    """Issue 59: the link to the atlas.html of an atlas built in the Dataset tab answered 403: the user-cache
    folder the app keeps them in was not among the served paths."""
    url, _ = server
    page = kept(BUILT) / "cait_nano_64-8" / "atlas.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("<html>an atlas</html>")
    answer = httpx.get(f"{url}gradio_api/file={page}", timeout=30)
    assert answer.status_code == 200 and answer.text == "<html>an atlas</html>"


def test_the_main_thread_sleeps_once_a_signal_is_heard():
    """Issue 59: after a signal the main thread spun in `Shutdown.wait` (an Event already set returns at once),
    at 100% CPU holding the GIL, so Gradio's removal of its temporary files on close, and the process's exit,
    took 35-75 s after a long session. Once asked, the main thread waits without spinning."""
    import threading

    from app.server import Shutdown

    shutdown = Shutdown()
    shutdown._asked.set()  # as the signal handler leaves it
    waits, real_wait = [], threading.Event.wait

    def counted(event, timeout=None):
        waits.append(1)
        return real_wait(event, timeout)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threading.Event, "wait", counted)
        threading.Thread(target=shutdown.wait, daemon=True).start()
        time.sleep(0.5)
    assert len(waits) <= 3, f"{len(waits)} waits in 0.5 s: the main thread spins"


def test_the_app_starts_when_its_first_answer_on_localhost_takes_longer_than_gradios_check(monkeypatch):
    """Gradio's launch stops the app when its first request to the server it started times out (3 s), which a
    loaded machine's can: the browser tests' servers exited at start, or while a page loaded. Launched here with
    that first request timing out, the app is served."""
    import gradio as gr

    from app.ui import launch

    head, timed_out = httpx.head, []

    def first_times_out(url, **kwargs):
        if not timed_out:
            timed_out.append(url)
            raise httpx.ReadTimeout("a loaded machine", request=httpx.Request("HEAD", url))
        return head(url, **kwargs)

    monkeypatch.setattr(httpx, "head", first_times_out)
    with gr.Blocks() as demo:
        gr.Markdown("served")
    try:
        launch(demo, port=free_port(), block=False)
        assert timed_out and httpx.get(demo.local_url, timeout=30).status_code == 200
    finally:
        demo.close()
