"""Where and in which precision a model runs: the `--device` and `--amp` choices every tool offers.

    device = resolve_device("auto")                  # cuda when present, else cpu
    dtype = autocast_dtype("auto", device)           # bf16 only where the hardware computes it natively
    with autocast(dtype, device):
        logits = model(x)

One owner for both facts, so training, evaluation and the app agree on what "auto" means.
"""
from __future__ import annotations

import contextlib

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")  # the --device flag's values
AMP_CHOICES = ("auto", "bf16", "fp16", "none")  # the --amp flag's values
PRECISION_CHOICES = ("auto", "fp32", "bf16")  # --precision of the inference tools (app, evaluate, analysis)
_PRECISION_AMP = {"auto": "auto", "fp32": "none", "bf16": "bf16"}
_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}
# torch's own probes of the CPU instructions that compute bf16 natively (private, hence looked up by name)
_CPU_BF16_PROBES = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")


class DeviceError(ValueError):
    """A device was asked for that this machine does not have; the message is one line."""


def resolve_device(name: str) -> torch.device:
    """The --device choice as a device: "auto" is CUDA when there is one, else the CPU. Asking for CUDA
    where there is none raises DeviceError (instead of failing later at the first .to())."""
    if name not in DEVICE_CHOICES:
        raise DeviceError(f"--device must be one of {', '.join(DEVICE_CHOICES)}, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda: no CUDA device is available")
    return torch.device(name)


def native_bf16(device: torch.device) -> bool:
    """Does this device compute bf16 natively? CPUs without AVX512-BF16/AMX emulate it (measured on an
    AVX2 EPYC: CaiT training steps 12x slower than fp32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in _CPU_BF16_PROBES)


def autocast_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The --amp choice as an autocast dtype (None = fp32); "auto" takes bf16 only where it is native."""
    if amp == "auto":
        return torch.bfloat16 if native_bf16(device) else None
    if amp not in _AMP_DTYPES:
        raise ValueError(f"--amp must be one of {', '.join(AMP_CHOICES)}, got {amp!r}")
    return _AMP_DTYPES[amp]


def inference_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """--precision of an inference tool as an autocast dtype for its forward-only passes (None = fp32);
    "auto" is bf16 exactly where --amp auto takes it (native bf16)."""
    if precision not in _PRECISION_AMP:
        raise ValueError(f"--precision must be one of {', '.join(PRECISION_CHOICES)}, got {precision!r}")
    return autocast_dtype(_PRECISION_AMP[precision], device)


def autocast(dtype: torch.dtype | None, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.autocast for `dtype`, or a no-op for None (fp32)."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
