"""A small convolutional network (``arch: cnn``): the baseline for image classification."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import at_least
from attnlab.errors import ConfigError
from attnlab.models.family import Capabilities, FamilyConfig, Inputs, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.nn.cnn import SmallConvNet


@dataclass(frozen=True)
class CNNConfig(FamilyConfig):
    """``d_model``, the channels of the first convolutions (the last has twice as many); the image's
    size and channels and the classes are the data's (DataShape)."""

    d_model: int = 32
    dropout: float = 0.1

    def check(self) -> None:
        at_least("d_model", self.d_model, 1)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1) (got {self.dropout})")

    def check_shape(self, shape: DataShape) -> None:
        height, width = shape.image_height, shape.image_width
        if height is not None and width is not None and min(height, width) < 2:
            raise ConfigError(f"a {height}x{width} image is too small for 2x2 max-pooling")


@register_family
class CNNFamily(ModelFamily):
    name = "cnn"
    config = CNNConfig
    # encoder/decoder mean reading and writing token sequences: an image model does neither
    capabilities = Capabilities(
        encoder=False, decoder=False, incremental_decoding=False, attention_weights=False, inputs=Inputs.IMAGES
    )

    @staticmethod
    def build(cfg: CNNConfig, shape: DataShape) -> SmallConvNet:
        return SmallConvNet(
            shape.need("channels", "arch 'cnn'"), cfg.d_model, shape.need("n_classes", "arch 'cnn'"), cfg.dropout
        )
