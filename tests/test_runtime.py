"""cait.runtime: what --device auto and --precision auto mean, in one place for train, evaluate and the app."""

import json
import math
import time

import pytest
import torch

from cait import runtime
from cait.runtime import DeviceError, autocast, autocast_dtype, resolve_device


@pytest.mark.parametrize("cuda", [True, False])
def test_auto_device_is_cuda_exactly_when_present(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_device("auto") == torch.device("cuda" if cuda else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_asking_for_missing_cuda_or_an_unknown_device_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match=r"^--device cuda: no CUDA device is available$"):
        resolve_device("cuda")
    with pytest.raises(DeviceError, match="one of auto, cpu, cuda, got 'tpu'"):
        resolve_device("tpu")


def _cpu_flags(monkeypatch, *, avx512_bf16: bool, amx: bool) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)


@pytest.mark.parametrize(
    "avx512_bf16,amx,speedup,expected",
    [
        (True, False, 2.6, torch.bfloat16),  # Zen 4: native and fast
        (False, True, 2.0, torch.bfloat16),  # AMX alone counts
        (True, False, 0.73, None),  # native instructions, but slower than fp32 (a Xeon without AMX)
        (True, False, 1.1, None),  # a near tie goes to fp32
    ],
)
def test_precision_auto_takes_bf16_only_where_it_measures_faster(
    monkeypatch, tmp_path, avx512_bf16, amx, speedup, expected
):
    _cpu_flags(monkeypatch, avx512_bf16=avx512_bf16, amx=amx)
    monkeypatch.setattr(runtime, "cpu_bf16_speedup", lambda: speedup)
    monkeypatch.setattr(runtime, "user_cache_dir", lambda: tmp_path)  # no decision stored yet
    assert autocast_dtype("auto", torch.device("cpu")) is expected
    assert autocast_dtype("bf16", torch.device("cpu")) is torch.bfloat16
    assert autocast_dtype("fp16", torch.device("cpu")) is torch.float16
    assert autocast_dtype("fp32", torch.device("cpu")) is None


@pytest.mark.parametrize("speedup", [2.6, 0.73])  # bf16 faster (Zen 4), bf16 slower (AVX512-BF16 without AMX)
def test_the_precision_chosen_carries_the_ratio_the_probe_timed(monkeypatch, tmp_path, speedup):
    """What the page says of fp32's time beside a bf16 forward comes from the probe's timing, kept in the choice:
    auto's own timing, and the one kept from it when bf16 is asked for (which times nothing)."""
    _cpu_flags(monkeypatch, avx512_bf16=True, amx=False)
    monkeypatch.setattr(runtime, "cpu_bf16_speedup", lambda: speedup)
    monkeypatch.setattr(runtime, "user_cache_dir", lambda: tmp_path)
    monkeypatch.setattr(runtime, "machine_load", lambda: 0.1)
    cpu = torch.device("cpu")
    assert runtime.choose_precision("auto", cpu).bf16_speedup == speedup
    monkeypatch.setattr(runtime, "cpu_bf16_speedup", lambda: pytest.fail("timed bf16 that was asked for"))
    asked = runtime.choose_precision("bf16", cpu)
    assert asked.dtype is torch.bfloat16 and asked.bf16_speedup == speedup
    assert runtime.choose_precision("fp32", cpu).bf16_speedup is None


def test_a_cpu_without_bf16_instructions_is_fp32_without_timing_anything(monkeypatch):
    _cpu_flags(monkeypatch, avx512_bf16=False, amx=False)
    monkeypatch.setattr(runtime, "cpu_bf16_speedup", lambda: pytest.fail("timed a CPU that emulates bf16"))
    assert autocast_dtype("auto", torch.device("cpu")) is None


def test_the_bf16_decision_is_measured_once_per_cpu_torch_and_threads_and_kept(monkeypatch, tmp_path):
    """Every start on the same machine and software decides the same: the first measures and stores, later
    ones (a new process: the in-process cache cleared) read the stored value, whatever a new timing says."""
    _cpu_flags(monkeypatch, avx512_bf16=True, amx=False)
    monkeypatch.delenv("CAIT_LENS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(runtime, "cpu_bf16_speedup", lambda: 1.5)
    monkeypatch.setattr(runtime, "machine_load", lambda: 0.1)  # a quiet machine: what it times is kept
    first = runtime.choose_precision("auto", torch.device("cpu"))
    assert first.dtype is torch.bfloat16 and "1.50x" in first.reason and first.decided == "measured now"
    monkeypatch.setattr(runtime, "cpu_bf16_speedup", lambda: 0.7)  # a noisy later timing is never taken
    again = runtime.choose_precision("auto", torch.device("cpu"))
    assert again.dtype is torch.bfloat16 and "kept in" in again.reason
    assert again.decided == f"remembered from {time.strftime('%Y-%m-%d')} on this CPU"
    stored = json.loads((tmp_path / "cait-lens" / "precision.json").read_text())
    key = f"{runtime.cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads"
    assert list(stored) == [key] and runtime.probe_key() == key
    asked = runtime.choose_precision("auto", torch.device("cpu"), remeasure=True)  # --remeasure-precision
    assert asked.dtype is None and asked.decided == "measured now"
    assert json.loads((tmp_path / "cait-lens" / "precision.json").read_text())[key]["bf16_speedup"] == 0.7
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))  # another machine's cache: measured anew
    assert runtime.choose_precision("auto", torch.device("cpu")).dtype is None
    assert runtime.choose_precision("fp32", torch.device("cpu")).reason == "--precision fp32 was asked for"


def test_the_bf16_speedup_is_measured_once_per_process(fresh_probe):
    torch.manual_seed(0)
    first, after = fresh_probe(), torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))  # the probe's model and input leave the caller's random draws alone
    assert first is None or 0 < first < math.inf  # None: implausible twice on a busy machine
    assert fresh_probe() == first
    assert fresh_probe.cache_info().misses == 1


def _stored(tmp_path, monkeypatch, records: dict) -> None:
    """A precision cache written by hand, and a CPU with bf16 instructions that would now time 1.5x."""
    _cpu_flags(monkeypatch, avx512_bf16=True, amx=False)
    monkeypatch.setattr(runtime, "user_cache_dir", lambda: tmp_path)
    (tmp_path / "precision.json").write_text(json.dumps(records))
    monkeypatch.setattr(runtime, "cpu_bf16_speedup", lambda: 1.5)


def test_a_stored_implausible_bf16_speedup_is_measured_again(monkeypatch, tmp_path):
    # what one loaded machine stored: a whole CaiT forward is 1.4-2.6x faster in bf16 on that CPU
    _stored(tmp_path, monkeypatch, {runtime.probe_key(): {"bf16_speedup": 13.08, "measured": "2026-11-20"}})
    choice = runtime.choose_precision("auto", torch.device("cpu"))
    assert choice.decided == "measured now" and "1.50x" in choice.reason
    assert json.loads((tmp_path / "precision.json").read_text())[runtime.probe_key()]["bf16_speedup"] == 1.5


@pytest.mark.parametrize(
    "key",
    [
        lambda: f"{runtime.cpu_model()} | torch 1.13.0 | {torch.get_num_threads()} threads",
        lambda: f"{runtime.cpu_model()} | torch {torch.__version__} | {torch.get_num_threads() + 3} threads",
        lambda: f"another CPU | torch {torch.__version__} | {torch.get_num_threads()} threads",
        lambda: f"{runtime.cpu_model()} | torch {torch.__version__}",  # before thread counts were kept
    ],
    ids=["torch", "threads", "cpu", "old-format"],
)
def test_a_bf16_speedup_stored_for_other_software_cpu_or_threads_is_measured_again(monkeypatch, tmp_path, key):
    _stored(tmp_path, monkeypatch, {key(): {"bf16_speedup": 0.5, "measured": "2026-11-20"}})
    choice = runtime.choose_precision("auto", torch.device("cpu"))
    assert choice.dtype is torch.bfloat16 and choice.decided == "measured now"
    assert set(json.loads((tmp_path / "precision.json").read_text())) == {key(), runtime.probe_key()}


@pytest.mark.parametrize(
    "stored_load, load_now, timed_again",
    [
        (3.0, 0.1, True),  # timed on a busy machine, and this start finds it quiet
        (None, 0.1, True),  # stored before loads were kept: the conditions are unknown
        (3.0, 2.0, False),  # busy then and now: nothing better to be had
        (0.2, 0.1, False),  # timed on a quiet machine: it holds
        (0.2, 3.0, False),
    ],
)
def test_a_timing_made_on_a_busy_machine_is_timed_again_on_a_quiet_one(
    monkeypatch, tmp_path, stored_load, load_now, timed_again
):
    entry = {"bf16_speedup": 0.7, "measured": "2026-11-20"} | ({"load": stored_load} if stored_load else {})
    _stored(tmp_path, monkeypatch, {runtime.probe_key(): entry})  # and a timing that would now say 1.5x
    monkeypatch.setattr(runtime, "machine_load", lambda: load_now)
    choice = runtime.choose_precision("auto", torch.device("cpu"))
    kept = json.loads((tmp_path / "precision.json").read_text())[runtime.probe_key()]
    if timed_again:
        assert choice.dtype is torch.bfloat16 and choice.decided == "measured now"
        assert kept == {"bf16_speedup": 1.5, "measured": time.strftime("%Y-%m-%d"), "load": load_now}
    else:
        assert choice.dtype is None and choice.decided == "remembered from 2026-11-20 on this CPU"
        assert kept == entry


def test_known_precision_is_choose_precisions_answer_when_it_needs_no_timing(monkeypatch, tmp_path):
    """What a server decides before it serves: anything but a timing; a timing is left to later (None)."""
    _stored(tmp_path, monkeypatch, {})
    monkeypatch.setattr(runtime, "cpu_bf16_speedup", lambda: pytest.fail("timed before serving"))
    cpu = torch.device("cpu")
    assert runtime.known_precision("auto", cpu) is None  # nothing stored: only a timing can say
    assert runtime.known_precision("fp32", cpu) == runtime.choose_precision("fp32", cpu)
    monkeypatch.setattr(runtime, "machine_load", lambda: 0.1)
    (tmp_path / "precision.json").write_text(json.dumps({runtime.probe_key(): {"bf16_speedup": 1.5, "load": 0.2}}))
    assert runtime.known_precision("auto", cpu) == runtime.choose_precision("auto", cpu)
    assert runtime.known_precision("auto", cpu).dtype is torch.bfloat16
    assert runtime.known_precision("auto", cpu, remeasure=True) is None
    _cpu_flags(monkeypatch, avx512_bf16=False, amx=False)
    assert runtime.known_precision("auto", cpu).decided == "no bf16 instructions"


@pytest.fixture
def fresh_probe():
    """The real, once-per-process cpu_bf16_speedup, with nothing remembered before or after the test."""
    runtime.cpu_bf16_speedup.cache_clear()
    yield runtime.cpu_bf16_speedup
    runtime.cpu_bf16_speedup.cache_clear()


def test_an_implausible_timing_is_timed_again_and_never_stored(monkeypatch, tmp_path, fresh_probe):
    _cpu_flags(monkeypatch, avx512_bf16=True, amx=False)
    monkeypatch.setattr(runtime, "user_cache_dir", lambda: tmp_path)
    timings = iter([13.08, 1.7])  # implausible once: timed again
    monkeypatch.setattr(runtime, "_forward_speedup", lambda: next(timings))
    assert fresh_probe() == 1.7
    fresh_probe.cache_clear()
    monkeypatch.setattr(runtime, "_forward_speedup", lambda: 0.05)  # implausible every time
    choice = runtime.choose_precision("auto", torch.device("cpu"))
    assert choice.dtype is None and choice.decided == "measured now, implausible"
    assert "outside the plausible 0.2-8x of fp32 twice" in choice.reason and "nothing kept" in choice.reason
    assert not (tmp_path / "precision.json").exists()


def test_the_probe_times_a_whole_forward_in_both_precisions(monkeypatch):
    # each round times fp32 and bf16 back to back, the order alternating; the median of the rounds' ratios
    seen = []
    real = runtime.autocast
    monkeypatch.setattr(runtime, "autocast", lambda dtype, device: seen.append(dtype) or real(dtype, device))
    speedup = runtime._forward_speedup(rounds=3)
    assert seen == [None, torch.bfloat16, None, torch.bfloat16, torch.bfloat16, None, None, torch.bfloat16]
    assert 0 < speedup < math.inf


@pytest.mark.parametrize("supported", [True, False])
def test_precision_auto_on_cuda_asks_cuda(monkeypatch, supported):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: supported)
    assert autocast_dtype("auto", torch.device("cuda")) is (torch.bfloat16 if supported else None)


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="--precision must be one of auto, fp32, bf16, fp16"):
        autocast_dtype("fp8", torch.device("cpu"))


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_autocast_runs_in_the_dtype_or_in_fp32(dtype):
    layer = torch.nn.Linear(4, 4)
    with autocast(dtype, torch.device("cpu")):
        out = layer(torch.randn(2, 4))
    assert out.dtype is (dtype or torch.float32)
