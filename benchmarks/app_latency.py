"""The app's speed goals (issue 32), measured in one run, each as a ratio between things timed together.

For each model the real app is started in this process on a free port (with --precision, default auto),
and measured against one plain fp32 forward pass of one image, `model(x)`:

  view: a click on an example in a real browser (headless Chromium) to every class-attention tile
        rendered, timed by the browser's own clock. Goal: <= 0.35 s a click (cait_xxs24_224).
  saliency: every method of the Saliency tab for one image in the app's precision, with each map's
        deletion/insertion scoring (the tab's default) and without; fp32 throughout for comparison.
        Goal: <= 15 s with scoring (cait_xxs24_224).
  start-up: `python app/main.py` (the default model) to its page served, in a process of its own. Goal: <= 6 s.
  floor: the same click on a bare Gradio page whose handler runs exactly one plain forward and shows a
        text, or ten new tiles in a gallery: what Gradio and the browser cost here, whatever the app.
  also /analyze through gradio_client, and analyse() in process.

For each of --beside-long (default cait_xxs24_224), issue 49's N36 in process: a new image's first view (the
page's handler on the quick lane) idle, beside a Causal view computed on the long lane (`torch_thread.call_long`),
and beside the same computation on the quick lane, as the app ran it before the long lane (interleaved rounds,
medians); goal <= 2x idle. And issue 59.16: the Causal view's seconds alone and while another page opens a new
image every 1.6 s (--view-every), in alternating rounds; goal <= 3x alone.

For each of --big-models (default cait_m48_448), the page's handlers are called in process on the torch thread, as
the app calls them (a big model's seconds dwarf Gradio's), against the same plain forward (issue 40):

  follow-up: `details` after a new image's first view, what runs before the page is interactive again.
        Goal: <= 3 forwards.
  causal estimate: the Causal tab's time over the cost it states before computing. Goal: within 1.5x.
  causal stop: from the Stop to the model free again, over one block's time (a forward / the blocks).
        Goal: <= 1 block.

The plain forward runs on the app's torch thread (`app.torch_thread`) with all of torch's threads, timed
once the page has gone idle, so that it is the forward alone, not the forward beside the browser.

Rounds are interleaved (cait/timing.py); medians. Models without local weights run with random weights
(speed does not depend on them). The handler's share of a click is split out by view_timeline.py.

    python benchmarks/app_latency.py [--models cait_xxs24_224 cait_nano_64] [--repeats 7] [--saliency-repeats 2]
                                   [--startup-repeats 3] [--no-floor]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
import torch  # noqa: E402
from gradio_client import Client, handle_file  # noqa: E402
from PIL import Image  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from app import causal_view, torch_thread  # noqa: E402
from app.choices import region_choices  # noqa: E402
from app.loading import load_page_model  # noqa: E402
from app.models import ModelCache, ModelChoice  # noqa: E402
from app.session import analyse, saliency_rows  # noqa: E402
from app.shared import SCALES, VIEWS, Look  # noqa: E402
from app.tabs.dataset import AtlasPlaces  # noqa: E402
from app.ui import Tabs, build_app, compose, launch  # noqa: E402
from cait import explain  # noqa: E402
from cait.explain import hooks  # noqa: E402
from cait.figures import display_base  # noqa: E402
from cait.flags import add_precision_flag  # noqa: E402
from cait.runtime import inference_dtype  # noqa: E402
from cait.timing import time_interleaved  # noqa: E402

CPU = torch.device("cpu")
GOALS = {"view_s": 0.35, "saliency_app_s": 15.0, "startup_s": 6.0}  # issue 32 (view, saliency: cait_xxs24_224)
BESIDE_GOAL = 2.0  # issue 49's N36: a view beside long work within 2x its idle time
LONG_GOAL = 3.0  # issue 59.16: long work while another page browses within 3x its time alone
VIEW_EVERY_S = 1.6  # issue 59.16: the other page opened an example every ~1.6 s
BIG_GOALS = {"follow_up_over_forward": 3.0, "causal_over_estimate": 1.5, "stop_over_block": 1.0}  # issue 40
CHROMIUM = "/usr/bin/chromium"
# Click example `i`, then wait (one animation frame at a time) until the tiles differ from before and are
# all decoded. Returns epoch ms by the browser's clock (performance.timeOrigin + now(), comparable with the
# server's time.time()): the click, when its queue/join request left the page, and the tiles rendered.
CLICK_EXAMPLE = """async (i) => {
    const tiles = () => [...document.querySelectorAll('.ca-grid img')];
    const before = tiles().map(t => t.src).join();
    performance.clearResourceTimings();
    const clock = () => performance.timeOrigin + performance.now();
    const start = clock();
    document.querySelectorAll('#examples button.thumbnail-item')[i].click();
    for (;;) {
        await new Promise(r => requestAnimationFrame(r));
        const now = tiles();
        if (now.length && now.map(t => t.src).join() !== before && now.every(t => t.complete && t.naturalWidth)) {
            const join = performance.getEntriesByType('resource').find(e => e.name.includes('/queue/join'));
            return {start, sent: performance.timeOrigin + join.startTime, end: clock()};
        }
    }
}"""
EXAMPLES_READY = "#examples button.thumbnail-item"


# The bare page of gradio_floor_seconds: click the button, wait until the output changed and its images are
# decoded.
CLICK_TO_SHOWN = """async () => {
    const shown = () => [...document.querySelectorAll('#out textarea, #out img')].map(e => e.value ?? e.src).join();
    const before = shown();
    const start = performance.now();
    document.querySelector('#go').click();
    for (;;) {
        await new Promise(r => requestAnimationFrame(r));
        const images = [...document.querySelectorAll('#out img')];
        if (shown() !== before && images.every(t => t.complete && t.naturalWidth))
            return (performance.now() - start) / 1000;
    }
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quiet(page) -> None:
    """Wait until the browser has drawn everything (plots too): forwards are timed on a quiet machine."""
    page.evaluate("() => new Promise(r => requestIdleCallback(() => r(), {timeout: 3000}))")
    time.sleep(0.2)


def browser_rounds(url: str, ready: str, click_round, forward, repeats: int) -> tuple[list, list[float]]:
    """What click_round(page, r) returned in rounds 1..repeats (round 0 warms up: first request, kernels,
    image decoders), and the seconds of the plain forward timed after each of them on the quiet page."""
    clicks, forwards = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        page.set_default_timeout(300_000)
        page.goto(url)
        page.wait_for_selector(ready)
        for r in range(repeats + 1):
            clicked = click_round(page, r)
            _quiet(page)
            forward_seconds = time_interleaved({"forward": forward}, repeats=1, warmup=0)["forward"]
            if r:
                clicks.append(clicked)
                forwards.append(forward_seconds)
        browser.close()
    return clicks, forwards


def click_example(page, r: int, read=lambda stamps: stamps):
    """One round on the app's page: an example clicked (they alternate), and read(its CLICK_EXAMPLE stamps)
    taken as soon as the tiles are rendered; the follow-up (downloads, other tabs) finishes before the next
    round, outside the timing."""
    href = page.evaluate("() => document.querySelector('#numbers_json a')?.href ?? ''")
    result = read(page.evaluate(CLICK_EXAMPLE, r % 2))
    page.wait_for_function("(old) => (document.querySelector('#numbers_json a')?.href ?? '') !== old", arg=href)
    return result


def browser_view_seconds(url: str, forward, repeats: int) -> tuple[float, float]:
    """The app: median click-to-rendered seconds of the class-attention view, and of the plain forward."""
    clicks, forwards = browser_rounds(url, EXAMPLES_READY, click_example, forward, repeats)
    return statistics.median((c["end"] - c["start"]) / 1e3 for c in clicks), statistics.median(forwards)


def gradio_floor_seconds(forward, tile: Image.Image, repeats: int) -> dict[str, float]:
    """What Gradio and the browser cost on this machine, whatever the app: a bare page whose button runs
    exactly one plain forward (on the torch thread with the app's one-image threads) and shows a text, or
    ten new JPEG tiles in a gallery (the view shows ten or more). Click to rendered, over the forward."""
    folder = Path(tempfile.mkdtemp(prefix="gradio-floor-"))

    def run(out: str) -> float:
        n = [0]

        def click():
            torch_thread.handler(forward)()
            n[0] += 1
            if out == "text":
                return str(n[0])
            files = [folder / f"{n[0]}_{i}.jpg" for i in range(10)]
            for i, f in enumerate(files):  # new pixels, new files: nothing served from a cache
                tile.putpixel((0, 0), (n[0] % 256, i, 0))
                tile.save(f, quality=90, subsampling=0)
            return [(str(f), f"{n[0]}.{i}") for i, f in enumerate(files)]

        with gr.Blocks() as demo:
            button = gr.Button("go", elem_id="go")
            shown = gr.Textbox(elem_id="out") if out == "text" else gr.Gallery(elem_id="out", columns=5)
            button.click(click, None, shown)
        port = free_port()
        demo.launch(server_port=port, prevent_thread_lock=True, quiet=True, allowed_paths=[str(folder)])
        try:
            views, forwards = browser_rounds(
                f"http://127.0.0.1:{port}/", "#go", lambda page, r: page.evaluate(CLICK_TO_SHOWN), forward, repeats
            )
        finally:
            demo.close()
        return statistics.median(views) / statistics.median(forwards)

    try:
        return {out: run(out) for out in ("text", "gallery")}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def saliency_seconds(app: ModelCache, fp32: ModelCache, choice: ModelChoice, image: str, repeats: int) -> dict:
    """Seconds for every method of the Saliency tab: in the app's precision with the scoring and without it,
    and in fp32 throughout with it."""
    methods = list(explain.METHODS)

    def run(cache: ModelCache, score: bool = True):
        loaded = cache.get(choice)
        a = analyse(loaded, image)
        options = explain.MethodOptions()
        return lambda: list(saliency_rows(loaded, a, target=a.top_class, methods=methods, options=options, score=score))

    # each run takes many seconds: no warm-up call needed, rounds alternate which goes first
    return time_interleaved(
        {"app": run(app), "app_unscored": run(app, score=False), "fp32": run(fp32)},
        repeats=repeats,
        warmup=0,
        calls=1,
        desc=f"{choice.name} saliency, {len(methods)} methods",
    )


def startup_seconds(repeats: int) -> float:
    """Median seconds from starting `python app/main.py` (the default model) to its page answering."""
    root = Path(__file__).resolve().parent.parent
    times = []
    for _ in range(repeats):
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(root)}
        start = time.perf_counter()
        cmd = [sys.executable, str(root / "app" / "main.py"), "--port", str(port)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"app/main.py exited with {proc.returncode}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as page:
                        page.read()
                    break
                except OSError:
                    time.sleep(0.05)
            times.append(time.perf_counter() - start)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return statistics.median(times)


def bench_model(name: str, args: argparse.Namespace) -> dict:
    dtype = inference_dtype(args.precision, CPU, remeasure=args.remeasure_precision)
    choice = ModelChoice(name, random_init=True)  # timing: random weights serve where none are cached
    app = ModelCache(load_page_model, max_bytes=2**34, device=CPU, dtype=dtype)
    fp32 = ModelCache(load_page_model, max_bytes=2**34, device=CPU)
    loaded = torch_thread.call(app.get, choice)
    image = loaded.examples[0][0]
    first = torch_thread.call(analyse, loaded, image)
    x = first.x

    def plain_forward() -> None:
        with torch.inference_mode():
            loaded.model(x)

    # every torch call on the app's torch thread, as the app makes them (app.torch_thread says why)
    forward = functools.partial(torch_thread.call, plain_forward)
    demo = build_app(app, choice)
    port = free_port()
    launch(demo, port=port, block=False)
    try:
        url = f"http://127.0.0.1:{port}/"
        view, view_forward = browser_view_seconds(url, forward, args.repeats)
        client = Client(url, verbose=False)
        in_process = torch_thread.handler(analyse)  # as the app's handlers run it
        sec = time_interleaved(
            {
                "forward": forward,
                "in_process": lambda: in_process(loaded, image),
                "api": lambda: client.predict(handle_file(image), api_name="/analyze"),
            },
            repeats=args.repeats,
            desc=f"{name} forward, analyse(), /analyze",
        )
    finally:
        demo.close()
    floor = gradio_floor_seconds(forward, display_base(first.view), args.repeats) if args.floor else {}
    sal = dict.fromkeys(("app", "app_unscored", "fp32"), float("nan"))
    if args.saliency_repeats:
        sal = torch_thread.call(saliency_seconds, app, fp32, choice, image, args.saliency_repeats)
    return {
        "model": name,
        "weights": loaded.source,
        "precision": str(dtype or "fp32"),
        "forward_ms": 1e3 * sec["forward"],
        "view_ms": 1e3 * view,
        "view_over_forward": view / view_forward,
        "api_over_forward": sec["api"] / sec["forward"],
        "in_process_over_forward": sec["in_process"] / sec["forward"],
        "saliency_app_s": sal["app"],
        "saliency_unscored_s": sal["app_unscored"],
        "saliency_fp32_s": sal["fp32"],
        "saliency_speedup": sal["fp32"] / sal["app"],
        **{f"floor_{out}_over_forward": ratio for out, ratio in floor.items()},
    }


def _causal_stopped(tabs: Tabs, loaded, a, *, stop_at: int, delay: float) -> float:
    """The Causal tab computed with its Stop pressed (from another thread, as the page's Stop request comes)
    `delay` seconds after `stop_at` blocks are knocked out, in the middle of a knockout's re-run: seconds from
    the Stop to the handler's return."""
    page, pressed = SimpleNamespace(session_hash="bench"), []

    def press() -> None:
        time.sleep(delay)
        pressed.append(time.perf_counter())
        tabs.causal.stops.press(page)

    def progress(done, **_) -> None:
        if done[0] == stop_at:
            threading.Thread(target=press).start()

    tabs.causal.stops.arm(page)  # the tab opened
    tabs.causal.kept = causal_view.Kept()  # from zero, not from the view computed before
    tabs.causal.opened(loaded.choice, a, None, page, progress)  # its own lanes (app.torch_thread)
    return time.perf_counter() - pressed[0]


def _clocks(fn, *args, on_torch: bool = True, **kwargs) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of fn(*args, **kwargs) on the torch thread (on_torch=False: in this
    thread, for a handler that picks its lanes itself): the CPU seconds' ratios hold on a loaded machine, where
    the wall clock's swing with the other jobs."""
    wall, cpu = time.perf_counter(), time.process_time()
    torch_thread.call(fn, *args, **kwargs) if on_torch else fn(*args, **kwargs)
    return time.perf_counter() - wall, time.process_time() - cpu


def big_model_goals(name: str, forward_repeats: int) -> dict:
    """A big model's follow-up, Causal tab cost and Stop, through the page's handlers in process (see the
    module doc), each over a plain forward of the same model timed in the same run (before and after)."""
    choice = ModelChoice(name, random_init=True)
    cache = ModelCache(load_page_model, max_bytes=2**36, device=CPU)
    loaded = torch_thread.call(cache.get, choice)
    _, _, tabs = torch_thread.call(compose, loaded, cache, AtlasPlaces.of(None, None))  # components only
    torch_thread.call(analyse, loaded, loaded.examples[0][0])  # the first of a process warms up, not timed
    a = torch_thread.call(analyse, loaded, loaded.examples[0][0])
    x = a.x.to(loaded.device)

    def plain_forward() -> None:
        with torch.inference_mode():
            loaded.model(x)

    forwards = [_clocks(plain_forward) for _ in range(forward_repeats)]
    look = dict(cmap="inferno", alpha=0.5, scale=SCALES[0], view=VIEWS[0], keep=1.0)
    asked = dict(choice=choice, analysis=a, th_row=1, th_col=1, region_of=region_choices(loaded.cfg)[0])
    follow_up = _clocks(tabs.image.details, **asked, **look)
    estimate = causal_view.forward_passes(loaded.cfg) * a.forward_seconds  # what the tab says before it runs
    page = SimpleNamespace(session_hash="bench")
    causal = _clocks(tabs.causal.opened, choice, a, None, page, lambda *_, **__: None, on_torch=False)
    a.causal = None
    # pressed halfway through the re-run of the blocks after the one knocked out (about half of them run)
    stop_seconds = _causal_stopped(tabs, loaded, a, stop_at=loaded.cfg.depth // 2, delay=forwards[0][0] / 4)
    forwards += [_clocks(plain_forward) for _ in range(forward_repeats)]
    wall, cpu = (statistics.median(f[k] for f in forwards) for k in (0, 1))
    block = wall / (loaded.cfg.depth + loaded.cfg.depth_token_only)
    return {
        "model": name,
        "forward_s": wall,
        "analysis_forward_s": a.forward_seconds,
        "follow_up_s": follow_up[0],
        "follow_up_over_forward": follow_up[0] / wall,
        "follow_up_cpu_over_forward": follow_up[1] / cpu,
        "causal_estimate_s": estimate,
        "causal_s": causal[0],
        "causal_over_estimate": causal[0] / estimate,
        "causal_cpu_passes": causal[1] / cpu,  # the tab's passes, as CPU time counts them
        "causal_passes_said": causal_view.forward_passes(loaded.cfg),
        "stop_s": stop_seconds,
        "block_s": block,
        "stop_over_block": stop_seconds / block,
    }


class _Enough(Exception):
    """The benchmark's long job ended (before the next block)."""


def _long_views(loaded, a, *, lane, stop: threading.Event) -> threading.Thread:
    """A thread running the Causal tab's computation of `a` over and over through `lane` (`call_long`, or
    `call` as the app ran it on its one torch thread before the long lane), from zero each time, until `stop`."""
    blocks = [*loaded.model.blocks, *loaded.model.blocks_token_only]

    def enough() -> None:
        if stop.is_set():
            raise _Enough

    def once() -> None:
        with hooks.before_each(blocks, enough):
            causal_view.compute(loaded.model, a.x, a.top_class)

    def loop() -> None:
        while not stop.is_set():
            try:
                lane(once)
            except _Enough:
                return

    thread = threading.Thread(target=loop)
    thread.start()
    return thread


def _browsing(view, stop: threading.Event, views: list[float], every: float) -> threading.Thread:
    """A thread standing for another page that opens a new image every `every` seconds (start to start; at once
    when a view took longer), each view's seconds appended to `views`, until `stop`."""

    def run() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            view()
            views.append(time.perf_counter() - start)
            stop.wait(max(0.0, every - views[-1]))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _long_beside_browsing(loaded, a, view, rounds: int, every: float) -> dict:
    """Issue 59.16: the Causal view on the long lane (giving way at each block, as the tab runs it) alone and
    while another page browses (`_browsing`), in alternating rounds: the medians, and the views' own seconds."""

    def causal() -> float:
        work = functools.partial(causal_view.compute, loaded.model, a.x, a.top_class)
        return _clocks(lambda: torch_thread.call_long(work, model=loaded.model), on_torch=False)[0]

    alone, beside, views = [], [], []
    for r in range(rounds):
        for mode in ("alone", "beside")[:: 1 if r % 2 == 0 else -1]:  # no mode always first
            if mode == "alone":
                alone.append(causal())
                continue
            stop = threading.Event()
            browser = _browsing(view, stop, views, every)
            beside.append(causal())
            stop.set()
            browser.join()
    ratios = [browsed / quiet for quiet, browsed in zip(alone, beside)]
    return {
        "long_alone_s": statistics.median(alone),
        "long_beside_views_s": statistics.median(beside),
        "long_beside_views_over_alone": statistics.median(ratios),
        "long_beside_views_rounds": ratios,
        "views_meanwhile": len(views),
        "view_while_long_s": statistics.median(views),
        "view_every_s": every,
    }


def beside_long_work(name: str, repeats: int, view_every: float = VIEW_EVERY_S) -> dict:
    """Issue 49's N36: a new image's first view (the page's handler on the quick lane, as a click runs it) idle,
    beside a Causal view computed on the long lane (now), and beside the same computation on the quick lane
    (before: one torch thread ran everything); and issue 59.16: the Causal view's own seconds alone and while
    another page opens a new image every `view_every` seconds (what the long job loses to the quick lane's
    priority)."""
    choice = ModelChoice(name, random_init=True)
    cache = ModelCache(load_page_model, max_bytes=2**34, device=CPU)
    loaded = torch_thread.call(cache.get, choice)
    _, page, tabs = torch_thread.call(compose, loaded, cache, AtlasPlaces.of(None, None))
    image, shown = loaded.examples[0][0], tuple(page.ca.ca_props.value)
    a = torch_thread.call(analyse, loaded, image)
    look = Look("inferno", 0.5, SCALES[0], VIEWS[0], 1.0)
    view = torch_thread.handler(
        lambda: tabs.image.analyse_path(choice, image, look, 1, shown, uploaded=False)
    )  # fmt: skip
    view()  # warm-up
    now = functools.partial(torch_thread.call_long, model=loaded.model)  # giving way at each block, as the tabs
    lanes = {"idle": None, "now": now, "before": torch_thread.handler(lambda fn: fn())}
    seconds: dict[str, list[float]] = {mode: [] for mode in lanes}
    for r in range(repeats):
        for mode in list(lanes)[r % 3 :] + list(lanes)[: r % 3]:  # rotated: no mode always first
            stop = threading.Event()
            runner = _long_views(loaded, a, lane=lanes[mode], stop=stop) if lanes[mode] else None
            time.sleep(1.0)  # the long job under way
            start = time.perf_counter()
            view()
            seconds[mode].append(time.perf_counter() - start)
            stop.set()
            if runner:
                runner.join()
    idle = statistics.median(seconds["idle"])
    return {
        "model": name,
        "view_idle_s": idle,
        "view_beside_long_s": statistics.median(seconds["now"]),
        "view_beside_long_before_s": statistics.median(seconds["before"]),
        "view_beside_long_over_idle": statistics.median(seconds["now"]) / idle,
        "view_beside_long_before_over_idle": statistics.median(seconds["before"]) / idle,
        **_long_beside_browsing(loaded, a, view, repeats, view_every),
    }


def report_beside(rows: list[dict]) -> None:
    for r in rows:
        print(
            f"{r['model']}: a new image's view {r['view_idle_s']:.2f} s idle, {r['view_beside_long_s']:.2f} s beside "
            f"a Causal view on the long lane, {r['view_beside_long_before_s']:.2f} s beside it on one thread (before)"
        )
        rounds = ", ".join(f"{x:.2f}" for x in r["long_beside_views_rounds"])
        print(
            f"  the Causal view {r['long_alone_s']:.1f} s alone, {r['long_beside_views_s']:.1f} s while another page "
            f"opens an image every {r['view_every_s']:g} s ({r['views_meanwhile']} views, "
            f"{r['view_while_long_s']:.2f} s each, {r['view_while_long_s'] / r['view_idle_s']:.2f}x idle); "
            f"rounds {rounds}"
        )
        before = r["view_beside_long_before_over_idle"]
        now = _verdict(r["view_beside_long_over_idle"], BESIDE_GOAL, "x")
        print(f"goal, view beside long work over idle (before: {before:.2f}x): {now}")
        long = _verdict(r["long_beside_views_over_alone"], LONG_GOAL, "x")
        print(f"goal, the Causal view while another page browses over its time alone: {long}")


def report_big(rows: list[dict]) -> None:
    for r in rows:
        print(
            f"{r['model']}: forward {r['forward_s']:.2f} s (the analysis' own {r['analysis_forward_s']:.2f} s); "
            f"follow-up {r['follow_up_s']:.1f} s; Causal tab {r['causal_s']:.1f} s against "
            f"{r['causal_estimate_s']:.1f} s stated; Stop to free {r['stop_s']:.2f} s, one block {r['block_s']:.2f} s"
        )
        print(
            f"  in CPU seconds over a forward's: follow-up {r['follow_up_cpu_over_forward']:.2f}, Causal tab "
            f"{r['causal_cpu_passes']:.1f} passes (it says {r['causal_passes_said']:.1f})"
        )
        ratio = r["causal_over_estimate"]
        said = {
            "follow-up before the page is interactive": (r["follow_up_over_forward"], "follow_up_over_forward", "fwd"),
            f"Causal tab time over its stated cost ({ratio:.2f}x)": (
                max(ratio, 1 / ratio),
                "causal_over_estimate",
                "x",
            ),
            "Stop to the model queue free": (r["stop_over_block"], "stop_over_block", "blocks"),
        }
        for what, (value, goal, unit) in said.items():
            print(f"goal, {what}: {_verdict(value, BIG_GOALS[goal], unit)}")


def _verdict(value: float, goal: float, unit: str) -> str:
    return f"{value:.2f} {unit} against <= {goal:g} {unit}: {'met' if value <= goal else 'NOT met'}"


def report(rows: list[dict], startup: float | None) -> None:
    print(f"torch threads {torch.get_num_threads()}, CPU, load average {os.getloadavg()[0]:.1f}")
    print(
        f"{'model':<16} {'precision':<15} {'forward ms':>10} {'view ms':>8} {'view/fwd':>8} {'api/fwd':>8} "
        f"{'saliency s':>10} {'unscored':>8} {'fp32 s':>7}"
    )
    for r in rows:
        print(
            f"{r['model']:<16} {r['precision']:<15} {r['forward_ms']:>10.1f} {r['view_ms']:>8.0f} "
            f"{r['view_over_forward']:>8.2f} {r['api_over_forward']:>8.2f} {r['saliency_app_s']:>10.1f} "
            f"{r['saliency_unscored_s']:>8.1f} {r['saliency_fp32_s']:>7.1f}"
        )
    for r in rows:
        if r["model"] != "cait_xxs24_224":
            continue
        print(f"goal, class-attention view click to rendered: {_verdict(r['view_ms'] / 1e3, GOALS['view_s'], 's')}")
        print(f"goal, all saliency methods with scoring: {_verdict(r['saliency_app_s'], GOALS['saliency_app_s'], 's')}")
        if "floor_text_over_forward" in r:
            print(
                f"Gradio's floor here: a bare page whose click runs one forward, to its result rendered: "
                f"{r['floor_text_over_forward']:.2f}x with a text, {r['floor_gallery_over_forward']:.2f}x with "
                f"ten tiles in a gallery"
            )
    if startup is not None:
        print(f"goal, app/main.py to its page served: {_verdict(startup, GOALS['startup_s'], 's')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["cait_xxs24_224", "cait_nano_64"], help="none: skip")
    add_precision_flag(parser, help="the app's --precision")
    parser.add_argument("--repeats", type=int, default=7, help="rounds of the view, /analyze and forward timings")
    parser.add_argument("--saliency-repeats", type=int, default=2, help="rounds of the saliency timing (0: skip it)")
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the bare Gradio page (Gradio's own cost on this machine)",
    )
    parser.add_argument("--startup-repeats", type=int, default=3, help="starts of app/main.py timed (0: skip it)")
    parser.add_argument(
        "--big-models",
        nargs="*",
        default=["cait_m48_448"],
        help="the follow-up, Causal tab and Stop goals (none: skip)",
    )
    parser.add_argument(
        "--beside-long",
        nargs="*",
        default=["cait_xxs24_224"],
        help="a new image's view beside a long Causal view, now and before the long lane (none: skip)",
    )
    parser.add_argument(
        "--view-every",
        type=float,
        default=VIEW_EVERY_S,
        help="seconds between another page's new images while the Causal view runs (issue 59.16; 0: no pause)",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args()
    startup = startup_seconds(args.startup_repeats) if args.startup_repeats else None  # before this process loads
    rows = [bench_model(name, args) for name in args.models]
    big = [big_model_goals(name, forward_repeats=3) for name in args.big_models]
    beside = [beside_long_work(name, args.repeats, args.view_every) for name in args.beside_long]
    report(rows, startup)
    report_big(big)
    report_beside(beside)
    if args.out:
        out = {"startup_s": startup, "models": rows, "big_models": big, "beside_long": beside}
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
