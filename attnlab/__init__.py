"""attnlab: the Transformer family end to end."""

from attnlab.errors import AttnlabError, CheckpointError, ConfigError, DataError, UsageError
from attnlab.models import FAMILIES, build_model, model_config, register_family
from attnlab.tasks import TASKS, register_task, task_config

__version__ = "0.1.0"

__all__ = ["model_config", "build_model", "register_family", "FAMILIES", "task_config", "register_task", "TASKS", "AttnlabError", "ConfigError", "DataError", "CheckpointError", "UsageError"]
