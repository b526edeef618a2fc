"""The speech recogniser (``arch: whisper``): Whisper's encoder-decoder (Radford et al. 2022) at the size
a laptop trains. The encoder is the frames family's (models/whisper_encoder.py: log-mels computed on
the model's device, SpecAugment in training, the convolutional stem, Whisper's sinusoids, a pre-norm
stack); the decoder is the Transformer's, with learned positions (``positions``, Whisper's) and its
output tied to the token table (``embeddings.tie: output``, Whisper's), cross-attending to every frame
token (nn/speech.py). Each side has its own depth (``depths``; default ``stack.n_layers``). The encoder
``reads`` each clip's own frames (``clip``, masking the padding after it) or, as Whisper, the whole
window, the clip padded with silence to the data's longest (``window``; what interop/whisper.py exports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from attnlab.config import flattened
from attnlab.models import transformer as parts
from attnlab.models.audio import (
    WAVEFORMS,
    ClipReading,
    LogMelFeatures,
    SpecAugmentation,
    check_sinusoid_width,
    spectrogram,
)
from attnlab.models.family import Capabilities, Depths, FamilyConfig, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig, fields_free_exact
from attnlab.models.transformer_config import Positions, TokenEmbeddings, TransformerFamily
from attnlab.nn.audio import ConvStem
from attnlab.nn.backends import BackendOptions
from attnlab.nn.positional import WhisperSinusoidalPositional
from attnlab.nn.speech import OwnFrames, SpeechRecognizer, WindowFrames

OF = "arch 'whisper'"
READINGS: dict[str, Callable[[int], OwnFrames | WindowFrames]] = {
    "clip": lambda samples: OwnFrames(),
    "window": WindowFrames,
}  # model.reads (models/audio.py's READS) -> what the encoder reads of a clip, given the data's longest in samples


@dataclass(frozen=True)
class WhisperConfig(FamilyConfig):
    """``features`` and ``augment`` (the log-mels and SpecAugment, as the frames family's), what the
    encoder ``reads`` (:data:`READINGS`), the Transformer's parts for the two stacks (small, pre-norm
    and GELU by default, as Whisper's), the transcript's learned ``positions`` and each side's ``depths``."""

    features: LogMelFeatures = LogMelFeatures()
    augment: SpecAugmentation = SpecAugmentation()
    reading: ClipReading = flattened(ClipReading())
    stack: StackConfig = StackConfig(d_model=64, n_heads=4, n_layers=3, d_ff=256, activation="gelu", norm="pre")
    positions: Positions = Positions(scheme="learned", max_len=32)
    embeddings: TokenEmbeddings = TokenEmbeddings(tie="output")
    backends: BackendOptions = BackendOptions()
    depths: Depths = Depths()

    def check(self) -> None:
        super().check()
        check_sinusoid_width(self.stack)

    def check_shape(self, shape: DataShape) -> None:
        self.features.check_shape(shape)

    @property
    def encoder_layers(self) -> int:
        return self.depths.encoder_layers(self.stack.n_layers)

    @property
    def decoder_layers(self) -> int:
        return self.depths.decoder_layers(self.stack.n_layers)


@register_family
class WhisperFamily(TransformerFamily):
    name = "whisper"
    config = WhisperConfig
    capabilities = Capabilities(
        encoder=True, decoder=True, incremental_decoding=True, attention_weights=True, inputs=WAVEFORMS
    )
    backends_fit = fields_free_exact  # a function read from the class: no self
    backends_refusal = "is blockwise or approximate, which a clip's few hundred tokens do not need"

    @staticmethod
    def build(cfg: WhisperConfig, shape: DataShape) -> SpeechRecognizer:
        vocab_size = shape.need("vocab_size", OF)
        tgt_embed = parts.embeddings(cfg, vocab_size)
        model = SpeechRecognizer(
            READINGS[cfg.reading.reads](shape.need("samples", OF)),
            spectrogram(cfg.features, cfg.augment, shape, OF),
            ConvStem(cfg.features.n_mels, cfg.stack.d_model),
            WhisperSinusoidalPositional(cfg.stack.d_model),
            parts.plain_encoder(cfg, cfg.encoder_layers),
            tgt_embed,
            parts.decoder(cfg, cfg.decoder_layers, cross=True),
            parts.output_projection(cfg, tgt_embed, vocab_size),
            shape.pad_id,
        )
        parts.init_weights(model)
        return model
