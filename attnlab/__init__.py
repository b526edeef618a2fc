"""attnlab: the Transformer family end to end."""

from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError, CheckpointError, ConfigError, DataError, UsageError
from attnlab.nn.build import build_model

__version__ = "0.1.0"

__all__ = ["ModelConfig", "build_model", "AttnlabError", "ConfigError", "DataError", "CheckpointError", "UsageError"]
