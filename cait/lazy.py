"""Package attributes loaded on first use (PEP 562's module __getattr__): a package whose parts import torch
names them here, so that importing it for its light names (configs, flags, a command's --help) costs no torch."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_attributes(package: str, owners: dict[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` of `package`: a name in `owners` (name -> submodule) is read from that submodule on
    first use; any other name is tried as a submodule not imported yet (e.g. `cait.preprocess` after a bare
    `import cait`)."""

    def __getattr__(name: str) -> Any:
        if name in owners:
            return getattr(importlib.import_module(f".{owners[name]}", package), name)
        try:
            return importlib.import_module(f".{name}", package)
        except ModuleNotFoundError as e:
            if e.name != f"{package}.{name}":
                raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
