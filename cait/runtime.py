"""Where and in which precision a model runs: what the `--device` and `--precision` choices mean.

    device = resolve_device("auto")                  # cuda when present, else cpu
    dtype = autocast_dtype("auto", device)           # bf16 only where it is faster than fp32 here (measured
                                                     # once per CPU model, torch version and thread count)
    with autocast(dtype, device):
        logits = model(x)

One owner for both facts, so training, evaluation and the app agree on what "auto" means.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import atomic_write
from .config import get_config
from .errors import InputError
from .flags import DEVICES, INFERENCE_PRECISIONS, PRECISIONS
from .model import CaiT

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
# torch's own probes of the CPU instructions that compute bf16 natively (private, hence looked up by name)
_CPU_BF16_PROBES = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
# how much faster than fp32 bf16 must measure on a CPU for "auto" to take it: bf16 costs a little accuracy,
# so a near tie goes to fp32 (benchmarks/README.md)
BF16_MIN_SPEEDUP = 1.2
# a bf16 speed-up outside this is the machine's load, not the CPU (one stored "13.08x" where the whole model
# runs 1.4-2.6x faster in bf16): it is timed again, and never stored
BF16_PLAUSIBLE = (0.2, 8.0)
# what the probe times: a whole forward of the default model's architecture at its 64 px training size
# (0.25 GMACs an image), PROBE_ROUNDS times each way
PROBE_MODEL, PROBE_BATCH, PROBE_ROUNDS = "cait_micro_64", 2, 7


class DeviceError(InputError):
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


def fast_bf16(device: torch.device, *, remeasure: bool = False) -> bool:
    """Is bf16 autocast faster than fp32 on this device? On CUDA, where it is supported. On a CPU, the
    instruction flags are necessary but not enough (without them bf16 is emulated; with them it depends on the
    chip), so it is measured once per CPU model, torch version and thread count (`stored_bf16_speedup`)."""
    return _auto_bf16(device, remeasure=remeasure)[0]


def _auto_bf16(
    device: torch.device, *, remeasure: bool = False, measure: bool = True
) -> tuple[bool, str, str, float | None] | None:
    """What "auto" decides on `device`: bf16 or not, how it was decided in a few words, why in a sentence, and
    the bf16 speed-up timed (None: not timed); None when only a timing can say and `measure` is off."""
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, "CUDA says", f"this CUDA device {'supports' if ok else 'does not support'} bf16", None
    if not _bf16_instructions():
        why = "this CPU has no bf16 instructions (AVX512-BF16 or AMX): bf16 would be emulated"
        return False, "no bf16 instructions", why, None
    probe = stored_bf16_speedup(remeasure=remeasure, measure=measure)
    if probe is None:
        return None
    if probe.speedup is None:
        return False, probe.decided, f"{probe.where}, so fp32", None
    fast = probe.speedup >= BF16_MIN_SPEEDUP
    verdict = "so bf16" if fast else f"below the {BF16_MIN_SPEEDUP:g}x bf16 must gain, so fp32"
    why = f"bf16 ran a whole forward at {probe.speedup:.2f}x fp32's speed on this CPU, {verdict} ({probe.where})"
    return fast, probe.decided, why, probe.speedup


def _bf16_instructions() -> bool:
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in _CPU_BF16_PROBES)


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


@dataclass(frozen=True)
class Bf16Probe:
    """What `stored_bf16_speedup` found: the speed-up (None: no plausible one), how it was decided, and where
    the number came from, in words."""

    speedup: float | None
    decided: str  # "measured now" or "remembered from DATE on this CPU"
    where: str


# a machine whose 1-minute load average per core is at most this is quiet: a timing made busier than that is
# taken for want of a better one, and measured again at a start that finds the machine quiet
QUIET_LOAD = 0.5


def machine_load() -> float:
    """The 1-minute load average per core (0 where the system does not say)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return 0.0


def _measured_quiet(entry: dict) -> bool:
    load = entry.get("load")  # absent: stored before loads were kept, so the conditions are unknown
    return isinstance(load, (int, float)) and load <= QUIET_LOAD


def probe_key() -> str:
    """What a stored bf16 speed-up holds for: a timing is valid only on the same CPU model, torch and threads."""
    return f"{cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def stored_bf16_speedup(*, remeasure: bool = False, measure: bool = True) -> Bf16Probe | None:
    """`cpu_bf16_speedup`, measured once per `probe_key` and kept in the user cache dir, so that every later start
    on the same machine, software and thread count decides the same (a fresh timing at each start once flipped
    between fp32 and bf16). Measured again when asked (`remeasure`), when the stored number is implausible, and
    when it was timed on a busy machine and this start finds it quiet (`QUIET_LOAD`): one timing at a busy
    moment does not decide for every later start. None when it would have to measure and `measure` is off."""
    path, key, load = user_cache_dir() / "precision.json", probe_key(), machine_load()
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    known = known if isinstance(known, dict) else {}
    entry = known.get(key)
    if not remeasure and isinstance(entry, dict) and _plausible(entry.get("bf16_speedup")):
        if _measured_quiet(entry) or load > QUIET_LOAD:
            date = entry.get("measured", "?")
            return Bf16Probe(float(entry["bf16_speedup"]), f"remembered from {date} on this CPU", f"kept in {path}")
    if not measure:
        return None
    speedup = cpu_bf16_speedup()
    if speedup is None:
        lo, hi = BF16_PLAUSIBLE
        where = f"bf16 timed outside the plausible {lo:g}-{hi:g}x of fp32 twice (a busy machine?), nothing kept"
        return Bf16Probe(None, "measured now, implausible", where)
    known[key] = {"bf16_speedup": round(speedup, 3), "measured": time.strftime("%Y-%m-%d"), "load": round(load, 2)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: f.write(json.dumps(known, indent=1).encode()))
        where = f"measured now at a load of {load:.2f} per core, kept in {path} for later starts"
    except OSError:
        where = "measured now; the cache dir is not writable, so later starts measure again"
    return Bf16Probe(speedup, "measured now", where)


def _plausible(speedup: object) -> bool:
    return isinstance(speedup, (int, float)) and BF16_PLAUSIBLE[0] <= speedup <= BF16_PLAUSIBLE[1]


@functools.cache
def cpu_bf16_speedup() -> float | None:
    """fp32 time / bf16 time of a whole forward of a small CaiT on this CPU at the current thread count, once
    per process; timed again once when implausible (`BF16_PLAUSIBLE`), None when that is too."""
    with torch.random.fork_rng(devices=[]):  # the caller's random draws stay the same, timed or remembered
        for _ in range(2):
            speedup = _forward_speedup()
            if _plausible(speedup):
                return speedup
    return None


def _forward_speedup(rounds: int = PROBE_ROUNDS) -> float:
    """The median over `rounds` of fp32 time / bf16 time of one batch through `PROBE_MODEL`, the two timed
    back to back in each round (in alternating order), so that a machine's load shifts both alike."""
    model = CaiT(get_config(PROBE_MODEL)).eval()
    x = torch.randn(PROBE_BATCH, model.cfg.in_chans, model.cfg.img_size, model.cfg.img_size)
    cpu = torch.device("cpu")

    def seconds(dtype: torch.dtype | None) -> float:
        with torch.inference_mode(), autocast(dtype, cpu):
            start = time.perf_counter()
            model(x)
            return time.perf_counter() - start

    seconds(None), seconds(torch.bfloat16)  # warm-up: first calls pay for allocation and kernel choice
    ratios = []
    for i in range(rounds):
        order = (None, torch.bfloat16) if i % 2 == 0 else (torch.bfloat16, None)
        times = {dtype: seconds(dtype) for dtype in order}
        ratios.append(times[None] / times[torch.bfloat16])
    return statistics.median(ratios)


def autocast_dtype(precision: str, device: torch.device, *, remeasure: bool = False) -> torch.dtype | None:
    """The --precision choice as an autocast dtype (None = fp32); "auto" takes bf16 only where it is faster
    (`remeasure`: time it again rather than trust the stored timing)."""
    if precision == "auto":
        return torch.bfloat16 if fast_bf16(device, remeasure=remeasure) else None
    if precision not in _DTYPES:
        raise InputError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return _DTYPES[precision]


def inference_dtype(precision: str, device: torch.device, *, remeasure: bool = False) -> torch.dtype | None:
    """--precision of an inference tool (no fp16) as an autocast dtype for its forward-only passes (None = fp32)."""
    return choose_precision(precision, device, remeasure=remeasure).dtype


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision of forward-only passes, how it was decided and why (for the log and the page)."""

    dtype: torch.dtype | None  # autocast dtype, None = fp32
    decided: str  # in a few words: "asked for", "measured now", "remembered from DATE on this CPU", ...
    reason: str  # the whole why, in a sentence
    # fp32's time over bf16's for a whole forward on this CPU, as the probe timed it (`stored_bf16_speedup`):
    # below 1 bf16 is the slower one (AVX512-BF16 without AMX). None: not timed (CUDA, no bf16 instructions,
    # a precision asked for with no timing kept)
    bf16_speedup: float | None = None

    @property
    def name(self) -> str:
        return "fp32" if self.dtype is None else "bf16"


def choose_precision(precision: str, device: torch.device, *, remeasure: bool = False) -> PrecisionChoice:
    """An inference tool's --precision as a `PrecisionChoice`: the autocast dtype, how it was decided and why
    (timing bf16 against fp32 first when "auto" needs it: seconds on a quiet machine, a minute on a busy one)."""
    return _precision(precision, device, remeasure=remeasure, measure=True)


def known_precision(precision: str, device: torch.device, *, remeasure: bool = False) -> PrecisionChoice | None:
    """`choose_precision`'s answer when it needs no timing (a precision asked for, CUDA, a CPU without bf16
    instructions, a stored timing that holds), else None: a server can start in fp32 and time bf16 meanwhile."""
    return _precision(precision, device, remeasure=remeasure, measure=False)


def _precision(precision: str, device: torch.device, *, remeasure: bool, measure: bool) -> PrecisionChoice | None:
    if precision not in INFERENCE_PRECISIONS:
        raise InputError(f"--precision must be one of {', '.join(INFERENCE_PRECISIONS)}, got {precision!r}")
    if precision != "auto":
        # bf16 asked for on a CPU: the speed-up kept from an earlier timing, if any (never timed here)
        kept = device.type == "cpu" and precision == "bf16" and _bf16_instructions()
        probe = stored_bf16_speedup(measure=False) if kept else None
        speedup = None if probe is None else probe.speedup
        return PrecisionChoice(_DTYPES[precision], "asked for", f"--precision {precision} was asked for", speedup)
    auto = _auto_bf16(device, remeasure=remeasure, measure=measure)
    if auto is None:
        return None
    fast, decided, why, speedup = auto
    return PrecisionChoice(torch.bfloat16 if fast else None, decided, f"--precision auto: {why}", speedup)


def autocast(dtype: torch.dtype | None, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.autocast for `dtype`, or a no-op for None (fp32)."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
