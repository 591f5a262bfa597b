"""CaiT (Touvron et al. 2021, "Going deeper with Image Transformers") with the tools to look inside it."""

from __future__ import annotations

from .config import DEFAULT_MODEL, CaiTConfig, ConfigError, get_config, list_models
from .errors import InputError
from .lazy import lazy_attributes

# Everything else needs torch, so it is imported on first use: a command line can list the variants
# (`cait.config`) and answer --help in milliseconds instead of the seconds a torch import takes.
_LAZY = {
    "CaiT": "model",
    "Insights": "insights",
    "load_model": "factory",
    "SourcedModel": "provenance",
    "CheckpointError": "checkpoint",
    "save_weights": "checkpoint",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "CaiT",
    "CaiTConfig",
    "CheckpointError",
    "ConfigError",
    "DEFAULT_MODEL",
    "Insights",
    "InputError",
    "SourcedModel",
    "get_config",
    "list_models",
    "load_model",
    "save_weights",
]
