"""A small convolutional network on log-mels (``arch: audio_cnn``): the non-Transformer baseline of
sound classification. The same front end as the AST's (models/audio.py: ``features``, ``augment``),
the images' SmallConvNet convolutions (nn/cnn.py) over the (1, n_mels, frames) log-mel image, and the
maximum over time per channel and band (nn/audio.py's SpectrogramCNN)."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import at_least
from attnlab.models.audio import WAVEFORMS, LogMelFeatures, SpecAugmentation, spectrogram
from attnlab.models.family import Capabilities, FamilyConfig, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.nn.audio import SpectrogramCNN

OF = "arch 'audio_cnn'"
DROPOUT = 0.1  # before the classifier, as the images' cnn's default; SpecAugment is the tunable regulariser


@dataclass(frozen=True)
class AudioCNNConfig(FamilyConfig):
    """``features`` (the log-mels), ``augment`` (SpecAugment) and ``width``, the channels of the first
    two convolutions (the third has twice as many)."""

    features: LogMelFeatures = LogMelFeatures()
    augment: SpecAugmentation = SpecAugmentation()
    width: int = 32

    def check(self) -> None:
        at_least("width", self.width, 1)
        at_least("features.n_mels", self.features.n_mels, 2)  # 2x2 max-pooling

    def check_shape(self, shape: DataShape) -> None:
        self.features.check_shape(shape)


@register_family
class AudioCNNFamily(ModelFamily):
    name = "audio_cnn"
    config = AudioCNNConfig
    capabilities = Capabilities(
        encoder=False, decoder=False, incremental_decoding=False, attention_weights=False, inputs=WAVEFORMS
    )

    @staticmethod
    def build(cfg: AudioCNNConfig, shape: DataShape) -> SpectrogramCNN:
        return SpectrogramCNN(
            spectrogram(cfg.features, cfg.augment, shape, OF),
            cfg.width,
            cfg.features.n_mels,
            shape.need("n_classes", OF),
            DROPOUT,
        )
