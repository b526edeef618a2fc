"""Data: tokenizers, corpora, batching.

Its public names (the README's commands import them) are imported on first use, not here: `attnlab data
list` and `--help` start without torch or numpy.
"""

import importlib
from typing import Any

_LAZY = {"scan_commands": "attnlab.data.scan", "write_example_digits": "attnlab.data.images"}

__all__ = ["scan_commands", "write_example_digits"]


def __getattr__(name: str) -> Any:
    """``attnlab.data.scan_commands`` and the like, from their modules on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
