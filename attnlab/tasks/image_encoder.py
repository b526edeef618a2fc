"""A pre-trained image encoder with no classifier of its own: what `attnlab import-hf` makes of a
Hugging Face ``ViTModel`` (an encoder and a pooler, no head), as tasks/encoder.py is for BERT's
``BertModel``. Nothing here trains or predicts: such a run is a starting point (``train.init_from``
in an image_classification config, which fine-tunes it) and a model to `inspect` (its class
probabilities are those of an untrained output layer). Its data section says how it reads an
image, as image_classification's (``resize``, ``colour``); its task state, the pixel statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnlab.errors import ConfigError
from attnlab.tasks.batching import Batching, Tokenizers
from attnlab.tasks.image_classification import ImageClassification, ImageClassificationConfig
from attnlab.tasks.task import register_task


def _untrainable() -> ConfigError:
    return ConfigError("data.task 'image_encoder' is a pre-trained image encoder with no head to train; fine-tune "
                       "it from an image_classification config with train.init_from: RUN")


@dataclass(frozen=True)
class ImageEncoderConfig(ImageClassificationConfig):
    """How the encoder reads an image (image_classification's fields; no data of its own)."""

    def check_trainable(self) -> None:
        raise _untrainable()


@register_task
class ImageEncoder(ImageClassification):
    """An image encoder's states, for inspection (data.task: image_encoder): an imported ViT without an
    output layer."""

    name = "image_encoder"
    config = ImageEncoderConfig
    commands = ("inspect",)
    untrained = ("classifier.out.",)  # ViTModel has the pooler (classifier.pool), no output layer
    predict = None

    @classmethod
    def prepare(cls, cfg: ImageEncoderConfig, batching: Batching, tokenizers: Tokenizers | None = None,
                state: dict[str, Any] | None = None) -> Any:
        raise _untrainable()
