"""The raw waveform as tokens (``arch: waveform_transformer``): frames of samples, with no spectrogram.
``model.waveform`` says how long a token is (``frame_ms``) and how many streams read the clip
(``streams``, each ``decimation`` times coarser than the next: 3 and 10 are the seed's ``audio[::100]``,
``audio[::10]``, ``audio``, here decimated through an anti-aliasing filter, nn/waveform.py). Each
stream's frames have their own linear map to d_model; the tokens of every stream, coarse first, carry
sinusoids of their time (in frames of the finest stream), and the pre-norm encoder stack and
``model.classifier`` read them as the other audio families do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from attnlab.config import TypedConfig, at_least
from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.audio import SoundTokenFamily
from attnlab.models.classifier import Classifier
from attnlab.models.family import FamilyConfig, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig
from attnlab.nn.positional import SinusoidalPositional
from attnlab.nn.waveform import WaveformTokens, WaveformTransformer

OF = "arch 'waveform_transformer'"


@dataclass(frozen=True)
class WaveformFraming(TypedConfig):
    """How the waveform becomes tokens (``model.waveform``): ``frame_ms`` milliseconds of samples a
    token, in ``streams`` streams at 1, 1/decimation, 1/decimation^2, ... of the data's rate."""

    section: ClassVar[str] = "model.waveform"

    frame_ms: float = 20.0
    streams: int = 1
    decimation: int = 10

    def check(self) -> None:
        if not (math.isfinite(self.frame_ms) and self.frame_ms > 0):
            raise ConfigError(f"waveform.frame_ms must be a positive number of milliseconds (got {self.frame_ms})")
        at_least("waveform.streams", self.streams, 1)
        at_least("waveform.decimation", self.decimation, 2)

    def frame(self, rate: int) -> int:
        """A token's samples at ``rate`` Hz."""
        return max(1, round(self.frame_ms * rate / 1000))

    def factors(self) -> list[int]:
        """Each stream's decimation factor, coarse first: [decimation^(streams - 1), ..., decimation, 1]."""
        return [self.decimation**k for k in reversed(range(self.streams))]

    def check_shape(self, shape: DataShape) -> None:
        if shape.sample_rate is not None and self.frame(shape.sample_rate) < 2:
            raise ConfigError(
                f"waveform.frame_ms ({self.frame_ms:g}) is under 2 samples at {shape.sample_rate:,} Hz: "
                f"a token would be one sample"
            )


@dataclass(frozen=True)
class WaveformTransformerConfig(FamilyConfig):
    """``waveform`` (the tokens), the encoder's ``stack`` (pre-norm and GELU) and ``classifier``
    (``mean`` pooling and a ``linear`` head by default)."""

    waveform: WaveformFraming = WaveformFraming()
    stack: StackConfig = StackConfig(d_model=64, n_heads=4, n_layers=4, d_ff=256, activation="gelu", norm="pre")
    classifier: Classifier = Classifier(pooling="mean", head="linear")

    def check(self) -> None:
        self.family.check_stack(self.stack)

    def check_shape(self, shape: DataShape) -> None:
        self.waveform.check_shape(shape)


@register_family
class WaveformTransformerFamily(SoundTokenFamily):
    name = "waveform_transformer"
    config = WaveformTransformerConfig

    @staticmethod
    def build(cfg: WaveformTransformerConfig, shape: DataShape) -> WaveformTransformer:
        d_model = cfg.stack.d_model
        model = WaveformTransformer(
            WaveformTokens(cfg.waveform.frame(shape.need("sample_rate", OF)), cfg.waveform.factors(), d_model),
            SinusoidalPositional(d_model),
            *SoundTokenFamily.token_encoding(cfg, shape, OF),
        )
        parts.init_weights(model)
        return model
