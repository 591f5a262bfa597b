"""Where and in which precision a model runs: what the `--device` and `--precision` choices mean.

    device = resolve_device("auto")                  # cuda when present, else cpu
    dtype = autocast_dtype("auto", device)           # bf16 only where it is faster than fp32 here
    with autocast(dtype, device):
        logits = model(x)

One owner for both facts, so training, evaluation and the app agree on what "auto" means.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time

import torch

from .flags import DEVICES, INFERENCE_PRECISIONS, PRECISIONS

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
# torch's own probes of the CPU instructions that compute bf16 natively (private, hence looked up by name)
_CPU_BF16_PROBES = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
# how much faster than fp32 bf16 must measure on a CPU for "auto" to take it: bf16 costs accuracy (maps
# ~0.5% off), so a near tie goes to fp32 (measured: a Xeon with AVX512-BF16 but no AMX 0.73x; a Zen 4 EPYC's
# CaiT inference 2.6x)
BF16_MIN_SPEEDUP = 1.2


class DeviceError(ValueError):
    """A device was asked for that this machine does not have; the message is one line."""


def resolve_device(name: str) -> torch.device:
    """The --device choice as a device: "auto" is CUDA when there is one, else the CPU. Asking for CUDA
    where there is none raises DeviceError (instead of failing later at the first .to())."""
    if name not in DEVICES:
        raise DeviceError(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda: no CUDA device is available")
    return torch.device(name)


def fast_bf16(device: torch.device) -> bool:
    """Is bf16 autocast faster than fp32 on this device? On CUDA, where it is supported. On a CPU, the
    instruction flags are necessary but not enough, so it is measured once per process: without
    AVX512-BF16/AMX bf16 is emulated (an AVX2 EPYC: CaiT training steps 12x slower); with AVX512-BF16 alone
    it depends on the chip (a Zen 4 EPYC: inference 2.6x faster; a Xeon whose AMX is hidden: a CaiT
    forward 0.72x, a linear layer 0.73x)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if not any(getattr(torch.cpu, probe, lambda: False)() for probe in _CPU_BF16_PROBES):
        return False
    return cpu_bf16_speedup() >= BF16_MIN_SPEEDUP


@functools.cache
def cpu_bf16_speedup() -> float:
    """fp32 time / bf16 time of one CaiT-sized linear layer (1024 tokens, 384 -> 1536) on this CPU at the
    current thread count: the best of a few interleaved calls each, ~0.1 s, once per process."""
    x, layer = torch.randn(1024, 384), torch.nn.Linear(384, 1536)
    best = {torch.float32: math.inf, torch.bfloat16: math.inf}
    with torch.no_grad():
        for _ in range(6):
            for dtype in best:
                with autocast(None if dtype is torch.float32 else dtype, torch.device("cpu")):
                    start = time.perf_counter()
                    layer(x)
                    best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The --precision choice as an autocast dtype (None = fp32); "auto" takes bf16 only where it is faster."""
    if precision == "auto":
        return torch.bfloat16 if fast_bf16(device) else None
    if precision not in _DTYPES:
        raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return _DTYPES[precision]


def inference_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """--precision of an inference tool (no fp16) as an autocast dtype for its forward-only passes."""
    if precision not in INFERENCE_PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(INFERENCE_PRECISIONS)}, got {precision!r}")
    return autocast_dtype(precision, device)


def autocast(dtype: torch.dtype | None, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.autocast for `dtype`, or a no-op for None (fp32)."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
