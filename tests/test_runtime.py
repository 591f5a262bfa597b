"""cait.runtime: what --device auto and --precision auto mean, in one place for train, evaluate and the app."""

import json
import math

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


def test_a_cpu_without_bf16_instructions_is_fp32_without_timing_anything(monkeypatch):
    _cpu_flags(monkeypatch, avx512_bf16=False, amx=False)
    monkeypatch.setattr(runtime, "cpu_bf16_speedup", lambda: pytest.fail("timed a CPU that emulates bf16"))
    assert autocast_dtype("auto", torch.device("cpu")) is None


def test_the_bf16_decision_is_measured_once_per_cpu_and_torch_and_kept(monkeypatch, tmp_path):
    """Every start on the same machine and software decides the same: the first measures and stores, later
    ones (a new process: the in-process cache cleared) read the stored value, whatever a new timing says."""
    _cpu_flags(monkeypatch, avx512_bf16=True, amx=False)
    monkeypatch.delenv("CAIT_LENS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(runtime, "cpu_bf16_speedup", lambda: 1.5)
    first = runtime.choose_precision("auto", torch.device("cpu"))
    assert first.dtype is torch.bfloat16 and "1.50x" in first.reason and "measured now" in first.reason
    monkeypatch.setattr(runtime, "cpu_bf16_speedup", lambda: 0.7)  # a noisy later timing is never taken
    again = runtime.choose_precision("auto", torch.device("cpu"))
    assert again.dtype is torch.bfloat16 and "kept in" in again.reason
    stored = json.loads((tmp_path / "cait-lens" / "precision.json").read_text())
    assert list(stored) == [f"{runtime.cpu_model()} | torch {torch.__version__}"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))  # another machine's cache: measured anew
    assert runtime.choose_precision("auto", torch.device("cpu")).dtype is None
    assert runtime.choose_precision("fp32", torch.device("cpu")).reason == "--precision fp32 was asked for"


def test_the_bf16_speedup_is_measured_once_per_process():
    runtime.cpu_bf16_speedup.cache_clear()
    first = runtime.cpu_bf16_speedup()
    assert 0 < first < math.inf
    assert runtime.cpu_bf16_speedup() == first
    assert runtime.cpu_bf16_speedup.cache_info().misses == 1


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
