"""Audio as a kind of input (``inputs: waveforms``), and the parts every family that reads it composes.

A batch of sound is its mono waveforms (B, S) at the data's ``sample_rate``, zero-padded to the data's
``samples`` (the longest clip, in samples: DataShape), with each clip's length (B,) in samples. The
model computes its own features on its device: ``model.features`` (:class:`LogMelFeatures`) says which
log-mel spectrogram (nn/spectrogram.py's LogMel, windows and hop in milliseconds of the data's rate),
``model.augment`` (:class:`SpecAugmentation`) the SpecAugment masks drawn in training mode only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Protocol

import torch
from torch import nn

from attnlab.config import TypedConfig, at_least, one_of
from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.classifier import Classifier
from attnlab.models.family import Capabilities, ModelFamily, input_kind
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig, fields_free_exact
from attnlab.models.vit import SUMMARIES
from attnlab.nn.audio import Spectrogram
from attnlab.nn.layers import Encoder
from attnlab.nn.spectrogram import SCALINGS, KaldiFbank, LogMel, SpecAugment
from attnlab.nn.vision import ClassToken, PatchMean

FILTERBANKS: dict[str, Callable[[int, int, int, int, str], LogMel | KaldiFbank]] = {
    "slaney": lambda rate, n_fft, hop, n_mels, scaling: LogMel(rate, n_fft, hop, n_mels, scaling=scaling),
    "kaldi": lambda rate, n_fft, hop, n_mels, scaling: KaldiFbank(rate, n_fft, hop, n_mels),
}  # features.filterbank -> its module at (rate, window, hop, bands, scaling)

WAVEFORMS = input_kind(
    "waveforms",
    "mono waveforms (B, S) at the data's sample_rate, zero-padded to its samples, "
    "with each clip's length (B,) in samples (models/audio.py)",
)


@dataclass(frozen=True)
class LogMelFeatures(TypedConfig):
    """The log-mel spectrogram a model computes from the waveforms (``model.features``): ``n_mels``
    bands, a window of ``window_ms`` and one frame every ``hop_ms`` milliseconds, by the ``filterbank``
    of FILTERBANKS: 'slaney' (Whisper's and librosa's: centred frames, a periodic Hann window, Slaney's
    scale and area norm from 0 Hz to half the rate; ``scaling`` 'whisper', log10 floored 80 dB below
    each clip's peak and (x + 4) / 4, or 'log', the natural log) or 'kaldi' (Kaldi's fbank, the AST's:
    nn/spectrogram.py's KaldiFbank, its own natural log: ``scaling`` 'log'); then (x - ``offset``) /
    ``scale`` (AST's AudioSet statistics: offset -4.2677393, scale 2 x 4.5689974)."""

    section: ClassVar[str] = "model.features"

    n_mels: int = 32
    window_ms: float = 25.0
    hop_ms: float = 10.0
    scaling: str = "whisper"
    filterbank: str = "slaney"
    offset: float = 0.0
    scale: float = 1.0

    def check(self) -> None:
        at_least("features.n_mels", self.n_mels, 1)
        for name in ("window_ms", "hop_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"features.{name} must be a positive number of milliseconds (got {value})")
        if self.hop_ms > self.window_ms:
            raise ConfigError(
                f"features.hop_ms ({self.hop_ms}) must be at most window_ms ({self.window_ms}): "
                f"frames would skip samples"
            )
        one_of("features.scaling", self.scaling, SCALINGS)
        one_of("features.filterbank", self.filterbank, FILTERBANKS)
        if self.filterbank == "kaldi" and self.scaling != "log":
            raise ConfigError(
                f"features.filterbank 'kaldi' takes the natural log: scaling 'log' (got {self.scaling!r})"
            )
        if not (math.isfinite(self.offset) and math.isfinite(self.scale) and self.scale > 0):
            raise ConfigError(
                f"features.offset must be a number and features.scale a positive one (got {self.offset}, {self.scale})"
            )

    def window(self, rate: int) -> int:
        """The window (n_fft) in samples at ``rate`` Hz."""
        return max(1, round(self.window_ms * rate / 1000))

    def hop(self, rate: int) -> int:
        """The hop in samples at ``rate`` Hz."""
        return max(1, round(self.hop_ms * rate / 1000))

    def frames(self, shape: DataShape, of: str = "the model") -> int:
        """The frames of the data's longest clip (the filterbank's count: LogMel's one per hop, Kaldi's
        whole windows)."""
        filterbank = self.log_mel(shape, of)
        samples = torch.tensor(shape.need("samples", of), device="cpu")  # a count, even where `info` builds on meta
        return int(filterbank.frames(samples))

    def check_shape(self, shape: DataShape) -> None:
        """A window of at least 2 samples at the data's rate, fewer bands than its frequency bins, and
        at least one frame per clip; sizes the data has not given yet are checked when it has."""
        if shape.sample_rate is None:
            return
        n_fft = self.window(shape.sample_rate)
        if n_fft < 2 or self.n_mels > n_fft // 2 + 1:
            raise ConfigError(
                f"features.n_mels ({self.n_mels}) must be at most the {n_fft // 2 + 1} frequency bins "
                f"of a {self.window_ms:g} ms window at {shape.sample_rate:,} Hz ({n_fft} samples)"
            )
        if shape.samples is not None and self.frames(shape) < 1:
            raise ConfigError(
                f"a clip of {shape.samples:,} samples is shorter than one hop of features.hop_ms "
                f"({self.hop_ms:g} ms at {shape.sample_rate:,} Hz)"
            )

    def log_mel(self, shape: DataShape, of: str = "the model") -> LogMel | KaldiFbank:
        """The filterbank (nn/spectrogram.py's LogMel or KaldiFbank) at the data's rate."""
        rate = shape.need("sample_rate", of)
        return FILTERBANKS[self.filterbank](rate, self.window(rate), self.hop(rate), self.n_mels, self.scaling)


READS = ("clip", "window")


@dataclass(frozen=True)
class ClipReading(TypedConfig):
    """What a sound encoder reads of each clip (``model.reads``, written in the model section itself):
    ``clip``, the clip's own frames, the padding after it masked (attnlab's), or ``window``, the whole
    window, the padding too, as Whisper's and the AST's encoders, which have no mask, read it (what
    their Hugging Face exports need)."""

    section: ClassVar[str] = "model"

    reads: str = "clip"

    def check(self) -> None:
        one_of("reads", self.reads, READS)


@dataclass(frozen=True)
class SpecAugmentation(TypedConfig):
    """SpecAugment in training (``model.augment``): ``freq_masks`` bands of up to ``freq_width`` mel
    channels and ``time_masks`` spans of up to ``time_width`` frames set to zero, drawn per clip within
    its own length (nn/spectrogram.py); 0 masks: none."""

    section: ClassVar[str] = "model.augment"

    freq_masks: int = 2
    freq_width: int = 4
    time_masks: int = 2
    time_width: int = 10

    def check(self) -> None:
        for name in ("freq_masks", "freq_width", "time_masks", "time_width"):
            at_least(f"augment.{name}", getattr(self, name), 0)

    def spec_augment(self) -> SpecAugment:
        return SpecAugment(
            freq_masks=self.freq_masks,
            freq_width=self.freq_width,
            time_masks=self.time_masks,
            time_width=self.time_width,
        )


def spectrogram(
    features: LogMelFeatures, augment: SpecAugmentation, shape: DataShape, of: str, frames: int | None = None
) -> Spectrogram:
    """The model's front end: waveforms -> (B, 1, n_mels, frames) log-mels, augmented in training;
    ``frames``: the first so many kept (a patch grid's), else every frame of the longest clip."""
    return Spectrogram(
        features.log_mel(shape, of),
        augment.spec_augment(),
        features.frames(shape, of) if frames is None else frames,
        features.offset,
        features.scale,
    )


def check_sinusoid_width(stack: StackConfig) -> None:
    """Whisper's sinusoids (nn/positional.py) need an even d_model of at least 4: half sines, half cosines."""
    at_least("stack.d_model", stack.d_model, 4)
    if stack.d_model % 2:
        raise ConfigError(
            f"stack.d_model ({stack.d_model}) must be even: Whisper's sinusoids are half sines, half cosines"
        )


class SoundTokens(Protocol):
    """What a family that reads sound as tokens configures of their encoding: the stack and the head."""

    @property
    def stack(self) -> StackConfig: ...

    @property
    def classifier(self) -> Classifier: ...


class SoundTokenFamily(ModelFamily):
    """The families that read sound as a sequence of tokens and classify it (whisper_encoder,
    waveform_transformer): waveforms in, no decoder, the exact backends, and the same encoding of the
    tokens (nn/audio.py's TokenEncoding: ``token_encoding``)."""

    capabilities = Capabilities(
        encoder=False, decoder=False, incremental_decoding=False, attention_weights=True, inputs=WAVEFORMS
    )
    backends_fit = fields_free_exact  # a function read from the class: no self
    backends_refusal = "is blockwise or approximate, which a clip's few hundred tokens do not need"

    @staticmethod
    def token_encoding(
        cfg: SoundTokens, shape: DataShape, of: str
    ) -> tuple[ClassToken | PatchMean, Encoder, nn.Module]:
        """The summary (a class token, or the tokens alone for the mean), the pre-norm stack and the head."""
        d_model = cfg.stack.d_model
        summary = SUMMARIES[cfg.classifier.pooling](d_model)
        head = cfg.classifier.build(d_model, shape.need("n_classes", of), cfg.stack.dropout, summary.pooling())
        return summary, parts.plain_encoder(cfg, cfg.stack.n_layers), head
