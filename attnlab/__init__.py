"""attnlab: the Transformer family end to end.

The registries and their functions (``model_config``, ``build_model``, ``FAMILIES``, ``task_config``,
``TASKS`` ...) are imported on first use, not here: they bring in torch, and ``attnlab --version``,
``--help`` and ``data list`` must start without it (tests/test_cli.py checks that they do).
"""

from __future__ import annotations

from attnlab.errors import AttnlabError, CheckpointError, ConfigError, DataError, UsageError
from attnlab.lazy import lazy_names

__version__ = "0.1.0"

_LAZY = {
    "model_config": "attnlab.models",
    "build_model": "attnlab.models",
    "register_family": "attnlab.models",
    "FAMILIES": "attnlab.models",
    "task_config": "attnlab.tasks",
    "register_task": "attnlab.tasks",
    "TASKS": "attnlab.tasks",
}

__all__ = [
    "model_config",
    "build_model",
    "register_family",
    "FAMILIES",
    "task_config",
    "register_task",
    "TASKS",
    "AttnlabError",
    "ConfigError",
    "DataError",
    "CheckpointError",
    "UsageError",
]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
