"""A small convolutional network (``arch: cnn``): the baseline for image classification."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import flattened
from attnlab.errors import ConfigError
from attnlab.models.family import Capabilities, FamilyConfig, Inputs, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig
from attnlab.nn.cnn import SmallConvNet


@dataclass(frozen=True)
class CNNConfig(FamilyConfig):
    """``d_model``, the channels of the first convolutions (the last has twice as many); the image's
    size and channels and the classes are the data's (DataShape)."""

    # d_model and dropout: a StackConfig's, composed flattened (config.flattened): written in the section
    # (model.d_model), its other fields kept at defaults that no value of these refuses (one head), and
    # no attention stack (models/stack.py)
    stack: StackConfig = flattened(StackConfig(d_model=32, n_heads=1, dropout=0.1), ("d_model", "dropout"))

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
            shape.need("channels", "arch 'cnn'"),
            cfg.stack.d_model,
            shape.need("n_classes", "arch 'cnn'"),
            cfg.stack.dropout,
        )
