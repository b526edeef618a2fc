"""A small convolutional network (``arch: cnn``): the baseline for image classification."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import at_least
from attnlab.errors import ConfigError
from attnlab.models.family import Capabilities, FamilyConfig, Inputs, ModelFamily, register_family
from attnlab.nn.cnn import SmallConvNet


@dataclass(frozen=True)
class CNNConfig(FamilyConfig):
    """The image's size and channels and the number of classes (set by the data); ``d_model``, the
    channels of the first convolutions (the last has twice as many)."""

    image_height: int
    image_width: int
    channels: int
    n_classes: int
    d_model: int = 32
    dropout: float = 0.1

    def check(self) -> None:
        for name in ("image_height", "image_width", "channels", "d_model"):
            at_least(name, getattr(self, name), 1)
        at_least("n_classes", self.n_classes, 2)
        if min(self.image_height, self.image_width) < 2:
            raise ConfigError(f"a {self.image_height}x{self.image_width} image is too small for 2x2 max-pooling")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1) (got {self.dropout})")


@register_family
class CNNFamily(ModelFamily):
    name = "cnn"
    config = CNNConfig
    # encoder/decoder mean reading and writing token sequences: an image model does neither
    capabilities = Capabilities(encoder=False, decoder=False, incremental_decoding=False, attention_weights=False,
                                inputs=Inputs.IMAGES)

    @staticmethod
    def build(cfg: CNNConfig) -> SmallConvNet:
        return SmallConvNet(cfg.channels, cfg.d_model, cfg.n_classes, cfg.dropout)
