"""Timing for the benchmarks and the throughput figures: one method and one statistic everywhere.

    seconds = time_interleaved({"ours": lambda: ours(x), "timm": lambda: theirs(x)}, repeats=7)
    ratio = seconds["timm"] / seconds["ours"]

Each function is warmed up (lazy initialisation, allocator, kernel choice), then the functions being
compared run in interleaved rounds whose order rotates, so that load from other processes (the CPU is
shared) hits them alike. In a round each function makes a fixed number of calls, or as many as make its
round last `min_seconds` (shorter rounds are dominated by timer and scheduler noise; a slow call runs once).
A function's figure is the median over rounds of its seconds per call. Results
are meant as ratios between functions timed together, never as absolute speeds.

torch.utils.benchmark.Timer does not fit the rounds: every timeit() adds at least two untimed warm-up
calls, which for a slow call (a training step, an integrated-gradients pass, an app request) triples the
cost of each round, and importing it probes for a C++ toolchain. Its clock's rule is kept: an
accelerator's queued work is waited for before reading the time.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch
from tqdm import tqdm


def time_interleaved(
    fns: dict[str, Callable[[], object]],
    *,
    repeats: int = 7,
    warmup: int = 1,
    calls: int | None = None,
    min_seconds: float = 0.2,
    desc: str | None = None,
    first_round: int = 0,
) -> dict[str, float]:
    """Median seconds per call of each function over `repeats` interleaved rounds (see module doc).
    calls: calls per round; None calibrates each function's from one timed call and `min_seconds`.
    first_round: the number of the first round, which sets whose turn it is to go first: a caller that times
    one round per call (for its own per-round ratios) passes its round's number, so the order still rotates."""
    if repeats < 1 or warmup < 0 or (calls is not None and calls < 1):
        raise ValueError(f"need repeats >= 1, warmup >= 0, calls >= 1; got {repeats}, {warmup}, {calls}")
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    per_round = {name: calls or max(1, math.ceil(min_seconds / max(_seconds(fn, 1), 1e-6))) for name, fn in fns.items()}
    rounds: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in tqdm(range(first_round, first_round + repeats), desc=desc, leave=False, disable=desc is None):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            rounds[name].append(_seconds(fns[name], per_round[name]) / per_round[name])
    return {name: statistics.median(times) for name, times in rounds.items()}


def _clock() -> float:
    if torch.accelerator.is_available():
        torch.accelerator.synchronize()
    return time.perf_counter()


def _seconds(fn: Callable[[], object], calls: int) -> float:
    start = _clock()
    for _ in range(calls):
        fn()
    return _clock() - start
