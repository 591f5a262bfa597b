"""Start the app from checked command-line arguments: device, the shared model cache with the default model
loaded, then the server; the precision decided meanwhile when only a timing can decide it. Every user mistake
ends in one line on stderr, no traceback; SIGINT and SIGTERM end the process within seconds, even while the
model computes."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from typing import Any

import gradio as gr
import torch
from gradio.server_messages import ProcessCompletedMessage

import cait
from app import texts, torch_thread
from app.loading import load_page_model
from app.models import LoadedModel, ModelCache, ModelChoice
from app.shared import log
from app.tabs.dataset import BUILT, AtlasPlaces
from app.ui import build_app, launch
from app.workdir import WORK, kept, own_gradio_cache
from cait import hub
from cait.factory import requested_variant
from cait.runtime import DeviceError, PrecisionChoice, choose_precision, known_precision, resolve_device

# the precision until the bf16 timing, which runs once the page is served, decides
TIMING = PrecisionChoice(
    None,
    "until bf16, timed in the background, decides",
    "--precision auto: bf16 is being timed against fp32 in the background; fp32 runs until it decides",
)
STOP_GRACE_S = 5.0  # how long closing the server may take before the process ends anyway


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("cait.app").setLevel(logging.INFO)  # user mistakes: one line each, no traceback
    shutdown = Shutdown()
    shutdown.install()
    try:
        device = resolve_device(args.device)
        precision = known_precision(args.precision, device, remeasure=args.remeasure_precision)
    except DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if precision is not None:
        _log_precision(precision)
    cache = ModelCache(
        load_page_model,  # every model of every page and of the Dataset tab's atlases: `cait.load_model`, on `device`
        max_bytes=int(args.model_memory_gb * 2**30),
        device=device,
        dtype=None if precision is None else precision.dtype,
        precision=precision or TIMING,
    )
    default = ModelChoice(  # --random-init holds for every model a page loads
        name=requested_variant(args.model, args.checkpoint),
        checkpoint=args.checkpoint,
        download=args.pretrained,
        random_init=args.random_init,
    )
    try:
        first = torch_thread.call(cache.get, default)
    except cait.InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if first.notice:
        print(f"warning: {first.notice}", file=sys.stderr)
    try:
        places = AtlasPlaces.of(args.atlas, args.atlas_dir)
        own_gradio_cache()  # before the page is built: its examples are cached there
        demo = build_app(cache, default, places)
        served = (*places.served(), str(kept(BUILT)))  # the atlases built in the Dataset tab link their pages too
        launch(demo, host=args.host, port=args.port, served=served, block=False)
    except OSError as e:  # the port was taken between the check and the bind
        print(
            f"error: cannot serve on {args.host}:{args.port} ({e.strerror or e}); choose another with --port",
            file=sys.stderr,
        )
        return 2
    shutdown.demo = demo
    if precision is None:
        threading.Thread(
            target=decide_precision, args=(args, device, cache, default, demo), name="cait-precision", daemon=True
        ).start()
    shutdown.wait()
    return 0


def _log_precision(precision: PrecisionChoice) -> None:
    log.info("forward-only passes in %s, %s: %s", precision.name, precision.decided, precision.reason)


def decide_precision(
    args: argparse.Namespace, device: torch.device, cache: ModelCache, default: ModelChoice, demo: gr.Blocks
) -> None:
    """Time bf16 against fp32 beside the quick lane (`torch_thread.call_aside`: a page's first click does not
    wait for it), then run every model in the precision chosen and let the page say so."""
    precision = torch_thread.call_aside(choose_precision, args.precision, device, remeasure=args.remeasure_precision)
    cache.set_precision(precision)
    _log_precision(precision)
    show_precision(demo, torch_thread.call(cache.get, default))


def show_precision(demo: gr.Blocks, loaded: LoadedModel) -> None:
    """The page a browser opens from now on says `loaded`'s precision: its header and Model tab, which Gradio
    serves from the configuration it made at launch (a page already open says it at its next model load)."""
    shown = {"header": texts.header_markdown(loaded, hub.cached_variants()), "model_md": texts.model_markdown(loaded)}
    for block in demo.blocks.values():
        if getattr(block, "elem_id", None) in shown:
            block.value = shown[block.elem_id]
    demo.config = demo.get_config_file()


ANSWER_S = 1.0  # how long the stop waits for the callers' streams to send them why
STOPPING = "The server is stopping (it was asked to end): this call was not finished. Call again once it is back."


def tell_callers(demo: gr.Blocks, message: str) -> None:
    """Answer every call the server holds (running or waiting) with `message` as its error and end its stream:
    the callers learn why instead of a dropped connection, and the server's close does not wait for their
    streams (it waited out its whole grace)."""
    servers = getattr(getattr(demo, "server", None), "servers", None) or []
    queue = getattr(demo, "_queue", None)
    if not servers or queue is None:
        return
    answered = asyncio.run_coroutine_threadsafe(_answer_all(queue, message), servers[0].get_loop())
    try:
        answered.result(timeout=ANSWER_S + 1.0)
    except Exception:  # the loop is gone or busy: the close goes on without it
        log.warning("stopping: could not tell the waiting callers")


async def _answer_all(queue: Any, message: str) -> None:
    """On the server's event loop (Gradio's queue is not thread-safe): each event's error message, then a wait
    (at most `ANSWER_S`) until each stream has sent it: a queue closed before would send "unexpected error"."""
    running = [event for job in queue.active_jobs if job for event in job]
    waiting = [event for events in queue.event_queue_per_concurrency_id.values() for event in events.queue]
    for event in running + waiting:
        queue.send_message(event, ProcessCompletedMessage(output={"error": message}, success=False, title="Error"))
    pending = lambda e: e._id in queue.pending_event_ids_session.get(e.session_hash, ())  # noqa: E731
    for _ in range(int(ANSWER_S / 0.05)):
        if not any(e.alive and pending(e) for e in running + waiting):
            return
        await asyncio.sleep(0.05)


class Shutdown:
    """SIGINT (Ctrl+C) and SIGTERM end the process within `STOP_GRACE_S` seconds: the server closed, the app's
    temporary folder removed, then the process ended without waiting for the torch thread, whose computation
    cannot be interrupted (a normal exit joins it: a Causal view or a long /analyze held Ctrl+C for minutes).
    A second signal ends it at once."""

    def __init__(self) -> None:
        self.demo: gr.Blocks | None = None
        self._asked = threading.Event()

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_signal)

    def wait(self) -> None:
        """Block (the main thread) until a signal has ended the process; once asked, without spinning (the set
        event returned at once: the main thread held the GIL at 100% CPU and the shutdown's work crawled)."""
        never = threading.Event()
        while True:
            never.wait(1.0)  # a timeout, so that the main thread runs the signal handler soon

    def _on_signal(self, signum: int, frame: object) -> None:
        if self._asked.is_set():
            os._exit(128 + signum)
        self._asked.set()
        threading.Thread(target=self._stop, args=(signum,), name="cait-stop", daemon=True).start()

    def _stop(self, signum: int) -> None:
        log.info("stopping on %s", signal.Signals(signum).name)
        watchdog = threading.Timer(STOP_GRACE_S, self._end)
        watchdog.daemon = True
        watchdog.start()
        if self.demo is not None:
            tell_callers(self.demo, STOPPING)
            self.demo.close(verbose=False)
        self._end()

    @staticmethod
    def _end() -> None:
        WORK.cleanup()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
