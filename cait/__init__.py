"""CaiT (Touvron et al. 2021, "Going deeper with Image Transformers") with the tools to look inside it."""
from .checkpoint import CheckpointError, save_weights
from .config import DEFAULT_MODEL, CaiTConfig, ConfigError, get_config, list_models
from .factory import create_model
from .model import CaiT, Insights

__all__ = ["CaiT", "CaiTConfig", "CheckpointError", "ConfigError", "DEFAULT_MODEL", "Insights", "create_model",
           "get_config", "list_models", "save_weights"]
