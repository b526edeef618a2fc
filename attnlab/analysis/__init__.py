"""Looking inside models: parameter, memory and compute budgets; attention analysis.

Its public names (the README's Python example and docs/analysis.md import them) are imported on first use,
not here: plots.py brings in matplotlib, which the commands that only read a budget never need.
"""

import importlib
from typing import Any

_LAZY = {"capture_attention": "attnlab.analysis.capture", "positional_plots": "attnlab.analysis.plots"}

__all__ = ["capture_attention", "positional_plots"]


def __getattr__(name: str) -> Any:
    """``attnlab.analysis.capture_attention`` and the like, from their modules on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
