"""Spectrogram frames as tokens (``arch: whisper_encoder``): Whisper's encoder (Radford et al. 2022)
read as a sound classifier. The model computes the log-mels from the waveforms on its own device
(``model.features``), masks them with SpecAugment in training (``model.augment``), reads each frame's
n_mels bands through Whisper's convolutional stem (two width-3 convolutions with GELU, the second of
stride 2: one token per two frames), adds Whisper's sinusoids and runs a pre-norm encoder stack with
a final LayerNorm; ``model.classifier`` summarises the tokens (``mean`` over each clip's own tokens
by default; ``cls`` prepends a class token, as ViT's) for a linear or pooled head.

Beside the AST's patches (models/spectrogram_transformer.py), this is the issue's first tokenisation:
a token is a 20 ms slice of every band at the default 10 ms hop, so the sequence is long in time and
the attention follows it. tests/test_whisper_encoder.py holds the encoder against transformers'
WhisperEncoder on the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.models import transformer as parts
from attnlab.models.audio import LogMelFeatures, SoundTokenFamily, SpecAugmentation, check_sinusoid_width, spectrogram
from attnlab.models.classifier import Classifier
from attnlab.models.family import FamilyConfig, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig
from attnlab.nn.audio import ConvStem, FrameTransformer
from attnlab.nn.positional import WhisperSinusoidalPositional

OF = "arch 'whisper_encoder'"


@dataclass(frozen=True)
class WhisperEncoderConfig(FamilyConfig):
    """``features`` (the log-mels: Whisper's 25 ms windows every 10 ms by default), ``augment``
    (SpecAugment), the encoder's ``stack`` (pre-norm and GELU, as Whisper's) and ``classifier``
    (``mean`` pooling and a ``linear`` head by default)."""

    features: LogMelFeatures = LogMelFeatures()
    augment: SpecAugmentation = SpecAugmentation()
    stack: StackConfig = StackConfig(d_model=64, n_heads=4, n_layers=4, d_ff=256, activation="gelu", norm="pre")
    classifier: Classifier = Classifier(pooling="mean", head="linear")

    def check(self) -> None:
        self.family.check_stack(self.stack)
        check_sinusoid_width(self.stack)

    def check_shape(self, shape: DataShape) -> None:
        self.features.check_shape(shape)


@register_family
class WhisperEncoderFamily(SoundTokenFamily):
    name = "whisper_encoder"
    config = WhisperEncoderConfig

    @staticmethod
    def build(cfg: WhisperEncoderConfig, shape: DataShape) -> FrameTransformer:
        model = FrameTransformer(
            spectrogram(cfg.features, cfg.augment, shape, OF),
            ConvStem(cfg.features.n_mels, cfg.stack.d_model),
            WhisperSinusoidalPositional(cfg.stack.d_model),
            *SoundTokenFamily.token_encoding(cfg, shape, OF),
        )
        parts.init_weights(model)
        return model
