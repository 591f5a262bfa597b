"""The models the app serves: what a browser session chose (`ModelChoice`), a loaded model with everything
the page shows about it (`LoadedModel`), and one bounded cache of loaded models shared by all sessions
(`ModelCache`: a memory ceiling in bytes, least recently used evicted first). No Gradio here; `app.loading`
builds a `LoadedModel`."""

from __future__ import annotations

import ctypes
import gc
import math
import threading
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

import cait
from cait import hub
from cait.provenance import ShippedCard, SourcedModel
from cait.runtime import PrecisionChoice, autocast


@dataclass(frozen=True)
class ModelChoice:
    """What a session asked for: a variant name, a checkpoint file, or both (timm/deit files need the name);
    the arguments of `cait.load_model`."""

    name: str | None
    checkpoint: str | None = None
    download: bool = False  # a paper variant's official weights may be downloaded when not cached
    random_init: bool = False  # a variant without weights here gets a seeded random init instead of an error

    def __str__(self) -> str:
        return " + ".join(part for part in (self.name, self.checkpoint) if part) or "nothing"


@dataclass
class LoadedModel:
    model: cait.CaiT
    choice: ModelChoice
    name: str  # the variant, or the checkpoint's file name (`cait.SourcedModel.name`)
    source: str  # where the weights came from, shown in the header and the Model tab
    notice: str  # "" or a warning shown everywhere (e.g. untrained weights)
    status: hub.WeightsStatus | None  # where the variant's weights stood at the load (None: a checkpoint file)
    device: torch.device
    dtype: torch.dtype | None  # autocast dtype of forward-only passes (None: fp32)
    labels: tuple[str, ...]
    examples: list[tuple[str, str]]  # (image path, caption)
    card: ShippedCard | None  # shipped model card and test accuracy, when there is one
    sourced: SourcedModel  # the library's record of the model (`cait.load_model`): what a head atlas is made of
    precision: PrecisionChoice | None = None  # how and why `dtype` was chosen, in words (None: not said)
    uid: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    fastest_forward: float = math.inf  # seconds: the fastest analysis forward pass so far (`timed_forward`)

    @property
    def cfg(self) -> cait.CaiTConfig:
        return self.model.cfg

    @property
    def nbytes(self) -> int:
        """Memory held by the weights and buffers (what the cache counts)."""
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        return sum(t.numel() * t.element_size() for t in tensors)

    def timed_forward(self, seconds: float) -> float:
        """Keep `seconds`, an analysis forward pass just timed, and return the fastest so far: stated costs are
        floors that multiply it, and one pass slowed by a busy moment would overstate them."""
        self.fastest_forward = min(self.fastest_forward, seconds)
        return self.fastest_forward

    @contextmanager
    def forward_only(self) -> Iterator[None]:
        """No autograd and the session's precision: for passes whose numbers are only read (predictions,
        class attention), never for gradients; the perturbation methods take `dtype` themselves."""
        with torch.inference_mode(), autocast(self.dtype, self.device):
            yield


def _return_memory_to_the_system() -> None:
    # Freed tensors stay in glibc's heap unless trimmed: without this a server that evicted a 1.4 GB
    # model keeps its resident size (measured: 6.7 GB after M48 and back).
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the allocator keeps what it keeps
        pass


class ModelCache:
    """Loaded models shared by every session, at most `max_bytes` of weights (the most recently used
    model is always kept, even alone above the ceiling). Thread-safe; two sessions asking for the same
    model at once load it once. A request keeps its model alive while it runs, even if evicted."""

    def __init__(self, loader: Callable[..., LoadedModel], *, max_bytes: int, **load_options: Any):
        """loader(choice, **load_options) loads one model (the app's: `app.loading.load_page_model`, with its device,
        dtype and precision as load_options)."""
        self._loader, self._options, self.max_bytes = loader, load_options, max_bytes
        self._models: OrderedDict[ModelChoice, LoadedModel] = OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict[ModelChoice, threading.Lock] = {}

    def get(self, choice: ModelChoice) -> LoadedModel:
        """The loaded model for `choice`, loading it (and evicting others) when it is not cached."""
        with self._lock:
            if choice in self._models:
                self._models.move_to_end(choice)
                return self._models[choice]
            loading = self._loading.setdefault(choice, threading.Lock())
        with loading:  # one loader per choice; other choices load or are served meanwhile
            with self._lock:
                if choice in self._models:
                    self._models.move_to_end(choice)
                    return self._models[choice]
            loaded = self._loader(choice, **self._options)  # the slow part, outside the cache lock
            with self._lock:
                self._precise(loaded)  # a precision decided while it loaded holds for it too
                self._models[choice] = loaded
                evicted = self._evict()
                self._loading.pop(choice, None)
        if evicted:
            _return_memory_to_the_system()
        return loaded

    def set_precision(self, precision: PrecisionChoice) -> None:
        """Forward-only passes of every model, cached or loaded from now on, in `precision` (a server starts in
        fp32 while bf16 is timed); a pass already running keeps the dtype it started with."""
        with self._lock:
            self._options.update(dtype=precision.dtype, precision=precision)
            for loaded in self._models.values():
                self._precise(loaded)

    def _precise(self, loaded: LoadedModel) -> None:
        if "precision" in self._options:
            loaded.dtype, loaded.precision = self._options["dtype"], self._options["precision"]

    def _evict(self) -> int:
        evicted = 0
        while len(self._models) > 1 and sum(m.nbytes for m in self._models.values()) > self.max_bytes:
            self._models.popitem(last=False)
            evicted += 1
        return evicted

    @property
    def cached(self) -> list[ModelChoice]:
        """Cached choices, least recently used first."""
        with self._lock:
            return list(self._models)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(m.nbytes for m in self._models.values())
