"""Two threads run all of the app's torch work: the quick lane (loading models, every view, redraw and
tile) and the long lane (work of many passes: the Causal tab's views and knockout profiles, the Mechanisms tab's
patching runs, an atlas build, /analyze's causal and patching sections), so that long work never blocks the page.

Why one thread per lane, not Gradio's worker threads: torch parallelises each operation over OpenMP threads,
and every Python thread that calls torch gets its own team of them. Measured on the 2-core CPU this app is
developed on (torch 2.14, xxs24_224, `session.analyse` of one photo in bf16): 33 ms when every torch call of the
process ran on one thread, 92-100 ms once a second thread had run torch too (the main thread loading the model,
then Gradio's worker threads analysing), and in the served app the class-attention view waited on the slow one.
One intra-op thread everywhere took 43 ms, but halved the speed of the saliency tab's batched passes; passive
OpenMP waiting (OMP_WAIT_POLICY) made every call slow (85 ms).

One-image passes (analysis, redraws, talking heads) leave one core to the browser that shows their result,
which mostly runs on the same machine: while Chromium drew the page after a click, one plain xxs24_224
forward in the server took ~74 ms with torch's two threads and ~61 ms with one (bare Gradio app, 2 cores;
alone: 42 and 62 ms). Batched work (the saliency tab's perturbation passes) uses every thread: 2 threads
ran a batch of 8 in 0.25-0.3 s, one in 0.44 s.

What runs beside what: quick work on the quick lane, one call at a time, in the order asked (sessions take
turns on it: a long saliency method delays another page's view by up to one method's time). Long work
(`call_long`) runs on the long lane beside it, one job at a time, with the one-image passes' threads (a core
is left to the browser, and a pass takes the time of the forward the page measured: what the stated costs are
counted in) at a lower OS priority (nice `LONG_NICE`), and it gives way: before each block of its model it
waits while quick work runs, so a view asked during a long job competes with at most one block of it, and a
long job loses the time of the quick work it let through, up to an allowance (its time so far within
`LONG_SLOWDOWN` times the CPU time it had): past it, it runs beside quick work, so that pages that browse without a
pause do not stall it (what its lower priority costs its blocks beside them is the OS's: measured in
benchmarks/README.md). The two lanes share the models (no second copy):
the explanation hooks act only on the thread that opened them (`cait.explain.hooks`). A long job of a page's
image is cancelled by the page's next image (`cancel_long`), whether it waits or runs, and its page's Stop
(`call_long(stop=...)`, `app.stops`) is heard at the same points; a part of it that runs no block of the model
(reading an atlas's scenes) is watched from beside it (`stoppable`). What each side costs is measured by
benchmarks/app_latency.py (`--beside-long`; benchmarks/README.md).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import math
import os
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator, TypeVar

import torch

from cait.explain import hooks

T = TypeVar("T")
_ALL_THREADS = torch.get_num_threads()  # torch's default (the physical cores), or OMP_NUM_THREADS
LONG_NICE = 10  # the long lane's OS priority below the quick lane's (and the browser's): the kernel favours them
PAUSE_CHECK_S = 0.1  # how often a paused long job looks whether it was cancelled
# a long job gives way to quick work only while its time since it started is under this many times the CPU time
# its thread has had (its work, with the one intra-op thread of two cores; with more, its own thread's share, and
# it gives way less), after a first grace: a view asked as it starts is served alone
LONG_SLOWDOWN, GIVE_WAY_GRACE_S = 3.0, 1.0

_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cait-torch")
_THREAD: list[threading.Thread] = []  # the executor's thread, once it has run something


class Cancelled(Exception):
    """Long work ended before it finished: its page moved on to another image (`cancel_long`)."""


def _remember_thread() -> None:
    _THREAD[:] = [threading.current_thread()]


def on_torch_thread() -> bool:
    """True on the quick lane's thread."""
    return bool(_THREAD) and threading.current_thread() is _THREAD[0]


class _QuickWork:
    """How many quick calls run now: the long lane waits while there are any."""

    def __init__(self) -> None:
        self.running = 0
        self.changed = threading.Condition()

    @contextmanager
    def running_one(self) -> Iterator[None]:
        with self.changed:
            self.running += 1
        try:
            yield
        finally:
            with self.changed:
                self.running -= 1
                self.changed.notify_all()

    def wait_until_none(self, cancelled: threading.Event, *, at_most: float = math.inf) -> bool:
        """Wait while quick work runs, at most `at_most` seconds: whether any ran (the caller gave way)."""
        deadline = time.monotonic() + at_most
        with self.changed:
            waited = bool(self.running)
            while self.running and not cancelled.is_set() and (left := deadline - time.monotonic()) > 0:
                self.changed.wait(min(PAUSE_CHECK_S, left))
            return waited


_QUICK = _QuickWork()


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) on the quick lane, waiting for its result (exceptions are raised here). It
    runs in a copy of the caller's context: Gradio finds the event of gr.Info and gr.Progress through
    context variables. Called on the quick lane itself, fn runs at once (no deadlock)."""
    if on_torch_thread():
        return fn(*args, **kwargs)
    context = contextvars.copy_context()

    def run() -> T:
        _remember_thread()
        with _QUICK.running_one():
            return context.run(fn, *args, **kwargs)

    return _EXECUTOR.submit(run).result()


class _Job:
    """One long call: its page, whether that page's next image has cancelled it, and its own stop check; whether
    the lane started it, or its caller gave up on it while it waited (then the lane skips it)."""

    def __init__(
        self, page: str | None, stop: Callable[[], None] | None, on_wait: Callable[[int], None] | None = None
    ) -> None:
        self.page, self.cancelled, self.stop, self.on_wait = page, threading.Event(), stop, on_wait
        self.started = self.abandoned = self.told = False
        self.turn = threading.Lock()  # started or abandoned: one of the two, never both
        self.began: tuple[float, float] | None = None  # its first checkpoint: (wall clock, the lane's CPU time)

    def start(self) -> bool:
        """The lane's turn came: False when its caller gave up meanwhile."""
        with self.turn:
            self.started = not self.abandoned
            return self.started

    def ended_while_waiting(self) -> None:
        """Checked while the job waits for the lane: its cancel or its stop (which raises) ends it there, rather
        than when the work ahead of it ends."""
        with self.turn:
            if self.started:
                return
            try:
                if self.cancelled.is_set():
                    raise Cancelled(f"long work of page {self.page} cancelled by its next image while it waited")
                if self.stop is not None:
                    self.stop()
            except BaseException:
                self.abandoned = True
                raise

    def checkpoint(self) -> None:
        """Between two blocks of long work: wait while quick work runs; end the work once cancelled, or when its
        stop check raises. Another thread's pass through the model goes on (its hooks act only on this lane's
        passes; this guards anyway)."""
        if getattr(_ON_LONG, "job", None) is not self:
            return
        self._give_way()
        if self.cancelled.is_set():
            raise Cancelled(f"long work of page {self.page} cancelled by its next image")
        if self.stop is not None:
            self.stop()

    def _give_way(self) -> None:
        """Wait while quick work runs, within the job's allowance: while its time since it started is under
        `GIVE_WAY_GRACE_S` and `LONG_SLOWDOWN` times the CPU time its thread had meanwhile. Pages browsing without a
        pause would otherwise hold it back for ever (a 7 s view took two minutes beside another page opening an
        example every 1.6 s). The CPU time, not the seconds it ran: beside quick work, at its lower priority, a
        block takes several times its time alone, and an allowance counted in those seconds let the job give way
        twice as long again (10x its time alone beside views asked without a pause). Its page is told when it
        gives way."""
        if self.began is None:
            self.began = (time.monotonic(), time.thread_time())
        wall, cpu = self.began
        allowance = GIVE_WAY_GRACE_S + LONG_SLOWDOWN * (time.thread_time() - cpu) - (time.monotonic() - wall)
        if allowance > 0:
            if _QUICK.running and self.on_wait is not None and not self.told:
                self.told = True  # the first time only: the next block's progress replaces the line
                self.on_wait(0)
            _QUICK.wait_until_none(self.cancelled, at_most=allowance)


def _long_lane_setup() -> None:
    torch.set_num_threads(interactive_threads())
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LONG_NICE)  # this thread (and its OpenMP team)
    except (OSError, AttributeError):  # no per-thread priority here: the pauses alone give way
        pass


_LONG_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cait-long", initializer=_long_lane_setup)
_PAGE_JOBS: defaultdict[str, set[_Job]] = defaultdict(set)
_JOBS_LOCK = threading.Lock()
_ON_LONG = threading.local()  # .job on the long lane's thread while it runs one


def on_long_lane() -> bool:
    return getattr(_ON_LONG, "job", None) is not None


_WAITING: list[_Job] = []  # the jobs asked for and not started, in order (under _JOBS_LOCK)
_RUNNING: list[_Job] = []  # the job the lane runs (under _JOBS_LOCK)


def _ahead(job: _Job) -> int:
    """The jobs the lane runs or will run before `job` (0 once it started)."""
    with _JOBS_LOCK:
        return 0 if job.started else len(_RUNNING) + _WAITING.index(job) if job in _WAITING else 0


def call_long(
    work: Callable[[], T],
    *,
    page: str | None = None,
    model: torch.nn.Module | None = None,
    stop: Callable[[], None] | None = None,
    on_wait: Callable[[int], None] | None = None,
) -> T:
    """work() on the long lane, waiting for its result (exceptions, `Cancelled` too, are raised here), in a copy
    of the caller's context (gr.Progress reaches its page). Call it from an event handler that does not run on
    the quick lane (the quick lane would wait for the long one, which waits for the quick lane to be idle).

    Args:
        work: the long computation, no arguments (a lambda or functools.partial).
        page: the browser page (Gradio's session hash) whose next image cancels this work (`cancel_long`), for
            work of one image; None for work that no image ends.
        model: a CaiT whose blocks work runs: before each block (on this lane only) the work waits while quick
            work runs, and ends with `Cancelled` once cancelled. Without it the work neither gives way nor
            stops early; cancelled while it waits for the lane, it does not start.
        stop: a check that raises to end the work (a page's Stop: `app.stops`), run every PAUSE_CHECK_S while
            the work waits for the lane (a Stop then ends it at once), when it starts, before each block of
            `model`, and while `stoppable` waits; what it raises is raised here.
        on_wait: told how many jobs run or wait before this one, whenever that changes while it waits for the
            lane (not when the lane is free), and 0 the first time it gives way to quick work: what its page says
            meanwhile.

    Returns:
        What work() returned; `Cancelled` instead when its page moved on before it returned, even past the
        model's last block (its answer would be drawn over the page's next image).
    """
    if on_torch_thread():
        raise RuntimeError("call_long from the quick lane: run the handler off it (torch_thread.handler(long=True))")
    if on_long_lane():  # long work inside long work: one job
        return work()
    context = contextvars.copy_context()
    # told from the lane too, in a copy of the caller's context (gr.Progress finds its event there)
    told = (lambda ahead: context.copy().run(on_wait, ahead)) if on_wait is not None else None
    job = _Job(page, stop, told)
    blocks = [*model.blocks, *model.blocks_token_only] if model is not None else []

    def run() -> T | None:
        with _JOBS_LOCK:
            _WAITING.remove(job)
            _RUNNING.append(job)
        _ON_LONG.job = job
        try:
            if not job.start():
                return None  # its caller gave up on it while it waited: nobody reads its answer
            job.checkpoint()  # cancelled while it waited for the lane, or quick work now: its turn first
            with hooks.before_each(blocks, job.checkpoint) if blocks else nullcontext():
                return context.run(work)
        finally:
            _ON_LONG.job = None
            with _JOBS_LOCK:
                _RUNNING.remove(job)

    with _JOBS_LOCK:
        if page is not None:
            _PAGE_JOBS[page].add(job)
        _WAITING.append(job)
    try:
        answer = _waited(_LONG_EXECUTOR.submit(run), job, on_wait)
        # cancelled past its model's last block (drawing its figures): its answer is of an image the page left
        if job.cancelled.is_set():
            raise Cancelled(f"long work of page {page} cancelled by its next image after its last block")
        return answer
    finally:
        with _JOBS_LOCK:
            if page is not None:
                _PAGE_JOBS[page].discard(job)
                if not _PAGE_JOBS[page]:
                    del _PAGE_JOBS[page]


def call_aside(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) on the long lane with all of torch's threads (as a plain quick call has them), waiting
    for its result: for a measurement of seconds that must not hold the quick lane (the server's start-up bf16
    probe: a click meanwhile waited for it), nor take the long lane's one-image thread count (its timing is
    stored per thread count). It neither gives way nor stops: quick work runs beside it, at a higher priority."""

    def run() -> T:
        torch.set_num_threads(all_threads())
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(interactive_threads())  # the long lane's own

    return call_long(run)


def _waited(future: Future, job: _Job, on_wait: Callable[[int], None] | None) -> Any:
    """The job's answer; while it waits for the lane, its cancel and stop are checked (they end it here) and
    on_wait told how many jobs are before it."""
    told = 0
    while True:
        try:
            return future.result(timeout=PAUSE_CHECK_S)
        except FutureTimeout:
            pass
        if job.started:
            return future.result()  # its own checks are the lane's from now on
        job.ended_while_waiting()
        ahead = _ahead(job)
        if on_wait is not None and ahead and ahead != told:
            on_wait(ahead)
        told = ahead


def stoppable(fn: Callable[[], T]) -> T:
    """fn() inside long work, for a part that runs no block of a model (reading its data): on a thread of its own
    while the job checks every PAUSE_CHECK_S whether to end (`call_long`: its page's next image, its stop), so that
    it ends within that time rather than at the model's first block. Ended, it raises at once and leaves fn to
    finish unseen (what it writes, a cache, stays for the next time). Outside long work, fn() as it is."""
    job = getattr(_ON_LONG, "job", None)
    if job is None:
        return fn()
    context, answer = contextvars.copy_context(), Future()

    def run() -> None:
        # one intra-op thread: its torch calls are small, and a team of OpenMP threads of its own would compete
        # with the lanes' (the module's docstring)
        torch.set_num_threads(1)
        try:
            answer.set_result(context.run(fn))
        except BaseException as e:  # noqa: BLE001 - handed to the waiting job, which raises it
            answer.set_exception(e)

    threading.Thread(target=run, name="cait-long-beside", daemon=True).start()
    while True:
        try:
            return answer.result(timeout=PAUSE_CHECK_S)
        except FutureTimeout:
            job.checkpoint()


def cancel_long(page: str | None) -> int:
    """A page moved on to another image: its long work of the last one ends (waiting: it does not start;
    running: before its model's next block). Returns how many jobs were cancelled."""
    with _JOBS_LOCK:
        jobs = list(_PAGE_JOBS.get(page, ())) if page is not None else []
    for job in jobs:
        job.cancelled.set()
    return len(jobs)


def all_threads() -> int:
    """Intra-op threads for batched work: torch's number when this module was imported. The caller's own
    setting does not count (torch's thread count is per thread: a script may have set its own to 1)."""
    return _ALL_THREADS


def interactive_threads() -> int:
    """Intra-op threads for one-image passes: all but one of torch's (at least one)."""
    return max(1, _ALL_THREADS - 1)


def _threads(n: int, fn: Callable[..., T]) -> Callable[..., T]:
    def run(*args: Any, **kwargs: Any) -> T:
        torch.set_num_threads(n)  # only this thread calls torch, so the setting is this call's alone
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(_ALL_THREADS)

    return run


def handler(fn: Callable, *, batched: bool = False, long: bool = False) -> Callable:
    """`fn` as an event handler whose body runs on the quick lane, with `interactive_threads()` (all threads
    when `batched`); a generator handler runs each step there and yields between steps, so that Gradio sends
    each update as before. long: the body runs on the long lane instead (`call_long`, without a page or a
    model: it neither gives way nor is cancelled; a handler that can should call `call_long` itself). The
    signature Gradio reads (event data, progress, API types) is fn's."""
    if long:
        return functools.wraps(fn)(lambda *args, **kwargs: call_long(functools.partial(fn, *args, **kwargs)))
    n = all_threads() if batched else interactive_threads()
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def steps(*args, **kwargs):
            generator, done = call(fn, *args, **kwargs), object()
            while (item := call(_threads(n, next), generator, done)) is not done:
                yield item

        return steps

    @functools.wraps(fn)
    def body(*args, **kwargs):
        return call(_threads(n, fn), *args, **kwargs)

    return body


__all__ = [
    "Cancelled",
    "all_threads",
    "call",
    "call_aside",
    "call_long",
    "cancel_long",
    "handler",
    "interactive_threads",
    "on_long_lane",
    "on_torch_thread",
    "stoppable",
]
