"""Tasks. Each is one module that declares its data section (only its own fields), how it prepares
the data, its loss and metrics, and the commands that use its runs, and registers itself
(tasks/task.py); ``data.task`` selects one (by default the task of ``data.format``). Adding a task
is one new module here: the package imports every module of its folder (those named below first,
in the order error messages list them), so it registers itself; from outside the package, any
module that calls ``register_task`` before the config is read."""

import importlib
import pkgutil

from attnlab.tasks.abilities import (
    Analysed,
    EvaluatesFiles,
    EvaluatesFileSplits,
    EvaluatesSplits,
    Pipelined,
    Predicts,
    Searched,
    Transcribes,
)
from attnlab.tasks.batching import Batching, TaskData
from attnlab.tasks.task import TASKS, Task, TaskConfig, register_task, task_config, task_named

# isort: off
# The built-in tasks register themselves on import, in the order error messages list them.
from attnlab.tasks.translation import Translation, TranslationConfig
from attnlab.tasks.language_model import LanguageModel, LanguageModelConfig
from attnlab.tasks.classification import Classification, ClassificationConfig
from attnlab.tasks.masked_lm import MaskedLM, MaskedLMConfig
from attnlab.tasks.image_classification import ImageClassification, ImageClassificationConfig
from attnlab.tasks.captioning import Captioning
from attnlab.tasks.captions_section import CaptioningConfig
from attnlab.tasks.contrastive import Contrastive, ContrastiveConfig
from attnlab.tasks.visual_qa import VisualQA, VisualQAConfig
from attnlab.tasks.node_classification import NodeClassification, NodeClassificationConfig
from attnlab.tasks.forecasting import Forecasting, ForecastingConfig
from attnlab.tasks.segment_language_model import SegmentLanguageModel, SegmentLanguageModelConfig
from attnlab.tasks.masked_translation import MaskedTranslation, MaskedTranslationConfig
from attnlab.tasks.encoder import EncoderConfig, TextEncoder
from attnlab.tasks.image_encoder import ImageEncoder, ImageEncoderConfig
# isort: on

for _module in pkgutil.iter_modules(__path__):  # a task not named above registers itself too
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "TASKS",
    "Batching",
    "Task",
    "TaskConfig",
    "TaskData",
    "Analysed",
    "EvaluatesFiles",
    "EvaluatesFileSplits",
    "EvaluatesSplits",
    "Pipelined",
    "Predicts",
    "Searched",
    "Transcribes",
    "register_task",
    "task_config",
    "task_named",
    "Translation",
    "TranslationConfig",
    "MaskedTranslation",
    "MaskedTranslationConfig",
    "LanguageModel",
    "LanguageModelConfig",
    "Classification",
    "ClassificationConfig",
    "MaskedLM",
    "MaskedLMConfig",
    "ImageClassification",
    "ImageClassificationConfig",
    "Captioning",
    "CaptioningConfig",
    "Contrastive",
    "ContrastiveConfig",
    "VisualQA",
    "VisualQAConfig",
    "NodeClassification",
    "NodeClassificationConfig",
    "Forecasting",
    "ForecastingConfig",
    "SegmentLanguageModel",
    "SegmentLanguageModelConfig",
    "TextEncoder",
    "EncoderConfig",
    "ImageEncoder",
    "ImageEncoderConfig",
]
