"""CaiT (Touvron et al. 2021, "Going deeper with Image Transformers") with the tools to look inside it."""

from __future__ import annotations

import importlib
from typing import Any

from .config import DEFAULT_MODEL, CaiTConfig, ConfigError, get_config, list_models

# Everything else needs torch, so it is imported on first use: a command line can list the variants
# (`cait.config`) and answer --help in milliseconds instead of the seconds a torch import takes.
_LAZY = {
    "CaiT": "model",
    "Insights": "model",
    "create_model": "factory",
    "load_model": "factory",
    "SourcedModel": "provenance",
    "CheckpointError": "checkpoint",
    "save_weights": "checkpoint",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    try:  # a submodule not imported yet, e.g. `cait.preprocess` after a bare `import cait`
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module 'cait' has no attribute {name!r}")


__all__ = [
    "CaiT",
    "CaiTConfig",
    "CheckpointError",
    "ConfigError",
    "DEFAULT_MODEL",
    "Insights",
    "SourcedModel",
    "create_model",
    "get_config",
    "list_models",
    "load_model",
    "save_weights",
]
