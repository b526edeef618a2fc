"""A pre-trained image encoder with no classifier of its own: what `attnlab import-hf` makes of a
Hugging Face ``ViTModel`` (an encoder and a pooler, no head), as tasks/encoder.py is for BERT's
``BertModel``. Nothing here trains or predicts: such a run is a starting point (``train.init_from``
in an image_classification config, which fine-tunes it) and a model to `inspect` (its class
probabilities are those of an untrained output layer). Its data section says how it reads an
image: ``images``, the part image_classification's composes too (tasks/parts.py: ImageSource:
colour, resize); its task state, the pixel statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.models.family import Inputs
from attnlab.models.shape import DataShape
from attnlab.tasks.batching import Batching, Tokenizers
from attnlab.tasks.image_batches import ImageBatch, ImageData, image_analysis_pass, image_shape
from attnlab.tasks.parts import ImageSource
from attnlab.tasks.task import Task, TaskConfig, register_task


def _untrainable() -> ConfigError:
    return ConfigError(
        "data.task 'image_encoder' is a pre-trained image encoder with no head to train; fine-tune "
        "it from an image_classification config with train.init_from: RUN"
    )


@dataclass(frozen=True)
class ImageEncoderConfig(TaskConfig):
    """How the encoder reads an image: ``images`` (colour, resize; no data of its own)."""

    images: ImageSource = ImageSource()

    def check(self) -> None:
        if self.images.dataset is not None:
            raise ConfigError(
                f"images.dataset: an image encoder reads no data set (got '{self.images.dataset}'); "
                f"`inspect` gives it its images"
            )

    def check_trainable(self) -> None:
        raise _untrainable()


@register_task
class ImageEncoder(Task[ImageData, ImageBatch]):
    """An image encoder's states, for inspection (data.task: image_encoder): an imported ViT without an
    output layer. It reads images as image_classification does."""

    name = "image_encoder"
    config = ImageEncoderConfig
    needs = {"inputs": Inputs.IMAGES}
    metrics = {"valid_loss": True, "accuracy": False, "macro_f1": False}
    commands = ("inspect",)
    counts = "examples"
    untrained = ("classifier.out.",)  # ViTModel has the pooler (classifier.pool), no output layer
    cfg: ImageEncoderConfig

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, Any] | None = None
    ) -> ImageData:
        raise _untrainable()

    def data_shape(self, data: ImageData | None = None) -> DataShape:
        return image_shape(self.cfg.images, None, data)

    def analysis_pass(self, model: nn.Module, batch: ImageBatch) -> dict[str, Tensor]:
        return image_analysis_pass(model, batch)
