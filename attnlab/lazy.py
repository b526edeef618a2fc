"""Public names that a package imports on first use rather than at its own import: what lets
``attnlab --version``, ``--help`` and ``data list`` start without torch, numpy or matplotlib
(tests/test_cli.py checks that they do). A package lists where each name lives and hands the
module-level ``__getattr__`` and ``__dir__`` (PEP 562) made here to its namespace."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_names(
    package: str, where: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``where`` maps each lazy name to the module
    that defines it; a name found is kept in ``namespace`` (the package's globals), so that later
    look-ups do not come back here."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
