"""cait/timing.py: the one timing method of the benchmarks and the throughput figures."""

import pytest

from cait.timing import time_interleaved


def test_medians_per_call_rank_the_functions_and_every_call_is_counted():
    counts = {"cheap": 0, "costly": 0}

    def work(name: str, size: int):
        def fn():
            counts[name] += 1
            sum(range(size))

        return fn

    sec = time_interleaved(
        {"cheap": work("cheap", 1_000), "costly": work("costly", 200_000)}, repeats=3, warmup=2, calls=4
    )
    assert counts == {"cheap": 2 + 3 * 4, "costly": 2 + 3 * 4}  # warm-up, then 3 rounds of 4 calls
    assert 0 < sec["cheap"] < sec["costly"]


def test_calls_per_round_are_calibrated_from_min_seconds():
    counts = {"fn": 0}

    def fn():
        counts["fn"] += 1

    time_interleaved({"fn": fn}, repeats=2, warmup=0, min_seconds=0.001)
    assert counts["fn"] > 1 + 2 * 2  # one calibration call, then rounds of several calls each


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="need repeats >= 1"):
        time_interleaved({"fn": lambda: None}, repeats=0)


def test_a_slow_call_runs_once_per_round_a_fast_one_many_times():
    counts = {"fast": 0, "slow": 0}

    def fast():
        counts["fast"] += 1

    def slow():
        counts["slow"] += 1
        sum(range(300_000))

    time_interleaved({"fast": fast, "slow": slow}, repeats=2, warmup=0, min_seconds=1e-4)
    assert counts["slow"] == 1 + 2 and counts["fast"] > 1 + 2 * 2


def test_rounds_timed_one_call_at_a_time_still_rotate_who_goes_first():
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    for r in range(3):
        time_interleaved(fns, repeats=1, warmup=0, calls=1, first_round=r)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
