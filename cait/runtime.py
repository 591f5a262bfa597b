"""Where and in which precision a model runs: what the `--device` and `--precision` choices mean.

    device = resolve_device("auto")                  # cuda when present, else cpu
    dtype = autocast_dtype("auto", device)           # bf16 only where it is faster than fp32 here (measured
                                                     # once per CPU model and torch version, then cached)
    with autocast(dtype, device):
        logits = model(x)

One owner for both facts, so training, evaluation and the app agree on what "auto" means.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .flags import DEVICES, INFERENCE_PRECISIONS, PRECISIONS

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
# torch's own probes of the CPU instructions that compute bf16 natively (private, hence looked up by name)
_CPU_BF16_PROBES = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
# how much faster than fp32 bf16 must measure on a CPU for "auto" to take it: bf16 costs a little accuracy,
# so a near tie goes to fp32 (benchmarks/README.md)
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
    instruction flags are necessary but not enough (without them bf16 is emulated; with them it depends on the
    chip), so it is measured once per CPU model and torch version (`stored_bf16_speedup`; benchmarks/README.md)."""
    return _auto_bf16(device)[0]


def _auto_bf16(device: torch.device) -> tuple[bool, str]:
    """What "auto" decides on `device`, and why in a sentence."""
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, f"this CUDA device {'supports' if ok else 'does not support'} bf16"
    if not any(getattr(torch.cpu, probe, lambda: False)() for probe in _CPU_BF16_PROBES):
        return False, "this CPU has no bf16 instructions (AVX512-BF16 or AMX): bf16 would be emulated"
    speedup, record = stored_bf16_speedup()
    fast = speedup >= BF16_MIN_SPEEDUP
    verdict = "so bf16" if fast else f"below the {BF16_MIN_SPEEDUP:g}x bf16 must gain, so fp32"
    return fast, f"bf16 measured {speedup:.2f}x fp32's speed on this CPU, {verdict} ({record})"


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


CACHE_ENV = "CAIT_LENS_CACHE"  # overrides where cait-lens keeps its caches (tests point it at a temp dir)


def user_cache_dir() -> Path:
    """Where cait-lens keeps what it makes or measures on this machine (the rendered scenes, the precision
    probe, timm's hub repo ids): $CAIT_LENS_CACHE, else $XDG_CACHE_HOME/cait-lens, else ~/.cache/cait-lens."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cait-lens"


def stored_bf16_speedup() -> tuple[float, str]:
    """`cpu_bf16_speedup`, measured once per (CPU model, torch version) and kept in the user cache dir, so that
    every later start on the same machine and software decides the same (a fresh timing at each start once
    flipped between fp32 and bf16). Returns the speedup and where it came from, in words."""
    path, key = user_cache_dir() / "precision.json", f"{cpu_model()} | torch {torch.__version__}"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known.get(key), dict) and isinstance(known[key].get("bf16_speedup"), (int, float)):
        entry = known[key]
        return float(entry["bf16_speedup"]), f"measured on {entry.get('measured', '?')}, kept in {path}"
    speedup = cpu_bf16_speedup()
    known[key] = {
        "bf16_speedup": round(speedup, 3),
        "measured": time.strftime("%Y-%m-%d"),
        "threads": torch.get_num_threads(),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, path)  # atomic: two starts at once never read half a file
        where = f"measured now, kept in {path} for later starts"
    except OSError:
        where = "measured now; the cache dir is not writable, so later starts measure again"
    return speedup, where


@functools.cache
def cpu_bf16_speedup() -> float:
    """fp32 time / bf16 time of one CaiT-sized linear layer (1024 tokens, 384 -> 1536) on this CPU at the
    current thread count: the best of 20 interleaved calls each (a shared machine's noise pushes the others
    up), ~0.3 s, once per process."""
    x, layer = torch.randn(1024, 384), torch.nn.Linear(384, 1536)
    best = {torch.float32: math.inf, torch.bfloat16: math.inf}
    with torch.no_grad():
        for _ in range(20):
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
    """--precision of an inference tool (no fp16) as an autocast dtype for its forward-only passes (None = fp32)."""
    return choose_precision(precision, device).dtype


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision of forward-only passes and why it was chosen (for the log and the page)."""

    dtype: torch.dtype | None  # autocast dtype, None = fp32
    reason: str

    @property
    def name(self) -> str:
        return "fp32" if self.dtype is None else "bf16"


def choose_precision(precision: str, device: torch.device) -> PrecisionChoice:
    """An inference tool's --precision as a `PrecisionChoice`: the autocast dtype with its reason in words."""
    if precision not in INFERENCE_PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(INFERENCE_PRECISIONS)}, got {precision!r}")
    if precision != "auto":
        return PrecisionChoice(_DTYPES[precision], f"--precision {precision} was asked for")
    fast, why = _auto_bf16(device)
    return PrecisionChoice(torch.bfloat16 if fast else None, f"--precision auto: {why}")


def autocast(dtype: torch.dtype | None, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.autocast for `dtype`, or a no-op for None (fp32)."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
