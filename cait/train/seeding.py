"""Randomness as a function of the seed: every draw of a training run comes from (seed, epoch, ...), and
the global RNG states travel in state.pt as tensors, so that a resumed run reproduces an unstopped one."""

from __future__ import annotations

import contextlib
import random
from typing import Any, Iterator

import numpy as np
import torch


def derive_seed(*parts: int) -> int:
    """One 32-bit seed from several integers (numpy's SeedSequence mixes them: (s, 1) and (s, 2) give unrelated
    streams)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed python/numpy/torch (CPU) for the block, then put their previous states back."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def rng_state() -> dict[str, Any]:
    """The global RNG states as tensors and plain containers, so torch.load(weights_only=True) reads them."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": [version, list(internal), gauss_next],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
