"""Evaluate a CaiT (`python -m cait.evaluate`, `__main__`): top-1 accuracy and, on data with boxes, where its
explanations point (`core`); under ImageNet-C corruptions, the sweep and its mCE against a baseline (`sweep`)."""

from .core import CHEAP_METHODS, cheap_methods, evaluate, format_table
from .sweep import corruption_section

__all__ = ["CHEAP_METHODS", "cheap_methods", "corruption_section", "evaluate", "format_table"]
