"""The CTC speech recogniser (``arch: whisper_ctc``): the frames family's encoder (models/whisper_encoder.py:
log-mels computed on the model's device, SpecAugment in training, Whisper's convolutional stem and
sinusoids, a pre-norm stack) and a linear map of each frame token to the vocabulary, whose PAD id is
CTC's blank (nn/speech.py's CTCRecognizer). It writes a transcript in one pass, with no decoder: the
encoder-decoder's (models/whisper.py) counterpart for data.task speech_recognition_ctc.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from attnlab.models import transformer as parts
from attnlab.models.audio import WAVEFORMS, LogMelFeatures, SpecAugmentation, check_sinusoid_width, spectrogram
from attnlab.models.family import Capabilities, FamilyConfig, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig, fields_free_exact
from attnlab.nn.audio import ConvStem
from attnlab.nn.positional import WhisperSinusoidalPositional
from attnlab.nn.speech import CTCRecognizer

OF = "arch 'whisper_ctc'"


@dataclass(frozen=True)
class WhisperCTCConfig(FamilyConfig):
    """``features`` and ``augment`` (the log-mels and SpecAugment, as the frames family's) and the
    encoder's ``stack`` (pre-norm and GELU, as Whisper's)."""

    features: LogMelFeatures = LogMelFeatures()
    augment: SpecAugmentation = SpecAugmentation()
    stack: StackConfig = StackConfig(d_model=64, n_heads=4, n_layers=4, d_ff=256, activation="gelu", norm="pre")

    def check(self) -> None:
        self.family.check_stack(self.stack)
        check_sinusoid_width(self.stack)

    def check_shape(self, shape: DataShape) -> None:
        self.features.check_shape(shape)


@register_family
class WhisperCTCFamily(ModelFamily):
    name = "whisper_ctc"
    config = WhisperCTCConfig
    # encoder: it reads the frames as a source sequence and writes its own sequence from them (the sound
    # classifiers, which write one label, declare none); decoder: no left-to-right decoding
    capabilities = Capabilities(
        encoder=True, decoder=False, incremental_decoding=False, attention_weights=True, inputs=WAVEFORMS
    )
    backends_fit = fields_free_exact  # a function read from the class: no self
    backends_refusal = "is blockwise or approximate, which a clip's few hundred tokens do not need"

    @staticmethod
    def build(cfg: WhisperCTCConfig, shape: DataShape) -> CTCRecognizer:
        d_model = cfg.stack.d_model
        model = CTCRecognizer(
            spectrogram(cfg.features, cfg.augment, shape, OF),
            ConvStem(cfg.features.n_mels, d_model),
            WhisperSinusoidalPositional(d_model),
            parts.plain_encoder(cfg, cfg.stack.n_layers),
            nn.Linear(d_model, shape.need("vocab_size", OF)),
            shape.pad_id,
        )
        parts.init_weights(model)
        return model
