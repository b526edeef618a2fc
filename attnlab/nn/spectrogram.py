"""Log-mel spectrograms and SpecAugment: audio features computed by ``torch.stft`` on the waveform's
device (a module's buffers follow ``.to(device)``), so a batch of waveforms becomes features where the
model runs, and augmentation draws its masks from an explicit ``torch.Generator``.

The mel filterbank is the triangular one of HTK / Slaney (librosa) / Kaldi, written as transformers'
``audio_utils.mel_filter_bank`` computes it (the reference of tests/test_spectrogram.py): centres
equally spaced on the mel scale between ``f_min`` and ``f_max``, triangles over the FFT bins' frequencies
in hertz (or, ``triangles="mel"``, in mels: AST's Kaldi bank), and Slaney's area normalisation
(``norm="slaney"``: each triangle scaled by 2 / its width in hertz).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

MelScale = Literal["htk", "kaldi", "slaney"]
MEL_SCALES = ("htk", "kaldi", "slaney")
NORMS = (None, "slaney")
SCALINGS = ("whisper", "log")

_SLANEY_HZ, _SLANEY_MEL, _SLANEY_STEP = 1000.0, 15.0, 27.0 / math.log(6.4)  # linear below 1 kHz, log above


def hertz_to_mel(hz: Tensor, scale: MelScale = "htk") -> Tensor:
    """Frequencies in Hz -> mels: HTK 2595 log10(1 + f/700), Kaldi 1127 ln(1 + f/700), or Slaney's
    (3 f / 200 below 1 kHz, logarithmic above)."""
    if scale == "htk":
        return 2595.0 * torch.log10(1.0 + hz / 700.0)
    if scale == "kaldi":
        return 1127.0 * torch.log(1.0 + hz / 700.0)
    return torch.where(
        hz >= _SLANEY_HZ, _SLANEY_MEL + torch.log(hz.clamp(min=1e-10) / _SLANEY_HZ) * _SLANEY_STEP, 3.0 * hz / 200.0
    )


def mel_to_hertz(mel: Tensor, scale: MelScale = "htk") -> Tensor:
    """The inverse of :func:`hertz_to_mel`."""
    if scale == "htk":
        return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)
    if scale == "kaldi":
        return 700.0 * (torch.exp(mel / 1127.0) - 1.0)
    return torch.where(
        mel >= _SLANEY_MEL, _SLANEY_HZ * torch.exp((mel - _SLANEY_MEL) / _SLANEY_STEP), 200.0 * mel / 3.0
    )


def mel_filter_bank(
    n_freqs: int,
    n_mels: int,
    f_min: float,
    f_max: float,
    rate: int,
    norm: str | None = None,
    scale: MelScale = "htk",
    triangles: str = "hertz",
) -> Tensor:
    """The (n_freqs, n_mels) float64 matrix from a power spectrum's bins (0 .. rate / 2) to mel bands;
    ``norm`` None or "slaney", ``scale`` htk / kaldi / slaney, ``triangles`` "hertz" or "mel"."""
    _check("norm", norm, NORMS)
    _check("mel scale", scale, MEL_SCALES)
    _check("triangles", triangles, ("hertz", "mel"))
    cpu = torch.device("cpu")  # a constant, made on the CPU even where a model is built on the meta device (`info`)
    mels = torch.linspace(
        hertz_to_mel(torch.tensor(f_min, dtype=torch.float64, device=cpu), scale).item(),
        hertz_to_mel(torch.tensor(f_max, dtype=torch.float64, device=cpu), scale).item(),
        n_mels + 2,
        dtype=torch.float64,
        device=cpu,
    )  # band edges and centres
    edges = mel_to_hertz(mels, scale)
    if triangles == "mel":  # the bins' frequencies in mels, against the centres in mels
        bins, points = (
            hertz_to_mel(torch.arange(n_freqs, dtype=torch.float64, device=cpu) * rate / (2 * (n_freqs - 1)), scale),
            mels,
        )
    else:
        bins, points = torch.linspace(0, rate // 2, n_freqs, dtype=torch.float64, device=cpu), edges
    slopes = points[None, :] - bins[:, None]  # (n_freqs, n_mels + 2)
    widths = points.diff()  # (n_mels + 1,)
    rising, falling = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
    bank = torch.minimum(rising, falling).clamp(min=0.0)  # (n_freqs, n_mels)
    if norm == "slaney":  # equal area: each triangle over 2 / its width (in Hz; in mels for mel triangles)
        bank = bank * (2.0 / (points[2:] - points[:-2]))[None, :]
    return bank


class LogMel(nn.Module):
    """Waveforms (B, T) or (T,) at ``rate`` Hz -> log-mel features (B, T // hop, n_mels), batch-first:
    one frame per ``hop`` samples (``torch.stft`` centred with reflection, its last frame dropped, as
    Whisper does), a periodic Hann window of ``n_fft``, the power spectrum through the mel bank.

    ``scaling="whisper"`` is Whisper's: log10 of the mel power (at least 1e-10), floored 8 (80 dB)
    below each example's maximum, then (x + 4) / 4. ``scaling="log"``: the natural log of the mel
    power, at least 1e-10. Defaults: Whisper's 80 bands at 16 kHz (25 ms windows, 10 ms hop).
    """

    window: Tensor  # (n_fft,), a buffer
    bank: Tensor  # (n_fft // 2 + 1, n_mels), a buffer

    def __init__(
        self,
        rate: int = 16_000,
        n_fft: int = 400,
        hop: int = 160,
        n_mels: int = 80,
        f_min: float = 0.0,
        f_max: float | None = None,
        norm: str | None = "slaney",
        scale: MelScale = "slaney",
        triangles: str = "hertz",
        scaling: str = "whisper",
    ):
        super().__init__()
        _check("scaling", scaling, SCALINGS)
        if not 0 < hop <= n_fft:
            raise ValueError(f"hop ({hop}) must be in 1 .. n_fft ({n_fft})")
        self.rate, self.n_fft, self.hop, self.n_mels, self.scaling = rate, n_fft, hop, n_mels, scaling
        bank = mel_filter_bank(
            n_fft // 2 + 1, n_mels, f_min, rate / 2 if f_max is None else f_max, rate, norm, scale, triangles
        )
        self.register_buffer("window", torch.hann_window(n_fft, periodic=True), persistent=False)
        self.register_buffer("bank", bank.float(), persistent=False)  # (n_fft // 2 + 1, n_mels)

    def forward(self, waveform: Tensor) -> Tensor:
        batched = waveform.dim() == 2
        x = waveform if batched else waveform[None]  # (B, T)
        spectrum = torch.stft(
            x.float(), self.n_fft, self.hop, window=self.window, center=True, pad_mode="reflect", return_complex=True
        )  # (B, n_fft // 2 + 1, frames + 1)
        power = spectrum[..., :-1].abs().square()  # (B, F, frames)
        mel = torch.matmul(power.transpose(1, 2), self.bank)  # (B, frames, n_mels)
        if self.scaling == "log":
            out = mel.clamp(min=1e-10).log()
        else:
            log = mel.clamp(min=1e-10).log10()
            floor = log.amax(dim=(1, 2), keepdim=True) - 8.0  # (B, 1, 1): 80 dB below the peak
            out = (torch.maximum(log, floor) + 4.0) / 4.0
        return out if batched else out[0]

    def frames(self, samples: Tensor) -> Tensor:
        """How many feature frames clips of ``samples`` samples give."""
        return samples // self.hop


class KaldiFbank(nn.Module):
    """Waveforms (B, T) or (T,) at ``rate`` Hz -> Kaldi's log mel filterbank (B, frames, n_mels), as
    Kaldi's compute-fbank-feats, torchaudio's ``kaldi.fbank`` and transformers' ASTFeatureExtractor (the
    AST's) compute it: frames of ``n_fft`` samples every ``hop``, not centred (1 + (T - n_fft) // hop of
    them), each less its own mean, pre-emphasised (x_t - 0.97 x_{t-1}; the first sample x_0 - 0.97 x_0),
    under a symmetric Hann window and zero-padded to the next power of two for the FFT; the power
    spectrum through Kaldi's bank (triangles in mels, ``f_min`` to half the rate, no normalisation); the
    natural log of at least float32's epsilon. Defaults: AST's 128 bands at 16 kHz (25 ms every 10 ms)."""

    window: Tensor  # (n_fft,), a buffer
    bank: Tensor  # (fft // 2 + 1, n_mels), a buffer

    FLOOR = float(torch.finfo(torch.float32).eps)  # Kaldi's (and the extractor's mel_floor)

    def __init__(
        self,
        rate: int = 16_000,
        n_fft: int = 400,
        hop: int = 160,
        n_mels: int = 128,
        f_min: float = 20.0,
        preemphasis: float = 0.97,
    ):
        super().__init__()
        if not 0 < hop <= n_fft:
            raise ValueError(f"hop ({hop}) must be in 1 .. n_fft ({n_fft})")
        self.rate, self.n_fft, self.hop, self.n_mels, self.preemphasis = rate, n_fft, hop, n_mels, preemphasis
        self.fft = 1 << (n_fft - 1).bit_length()  # the next power of two
        bank = mel_filter_bank(self.fft // 2 + 1, n_mels, f_min, rate / 2, rate, None, "kaldi", "mel")
        self.register_buffer("window", torch.hann_window(n_fft, periodic=False), persistent=False)
        self.register_buffer("bank", bank.float(), persistent=False)

    def forward(self, waveform: Tensor) -> Tensor:
        batched = waveform.dim() == 2
        x = (waveform if batched else waveform[None]).float()  # (B, T)
        frames = x.unfold(1, self.n_fft, self.hop)  # (B, F, n_fft), F = 1 + (T - n_fft) // hop
        frames = frames - frames.mean(-1, keepdim=True)  # each frame less its DC offset
        p = self.preemphasis
        frames = torch.cat([frames[..., :1] * (1 - p), frames[..., 1:] - p * frames[..., :-1]], dim=-1)
        spectrum = torch.fft.rfft(frames * self.window, n=self.fft)  # (B, F, fft // 2 + 1)
        power = spectrum.real.square() + spectrum.imag.square()
        out = torch.matmul(power, self.bank).clamp(min=self.FLOOR).log()  # (B, F, n_mels)
        return out if batched else out[0]

    def frames(self, samples: Tensor) -> Tensor:
        """How many feature frames clips of ``samples`` samples give (0 for a clip shorter than a window)."""
        return ((samples - self.n_fft) // self.hop + 1).clamp(min=0)


class SpecAugment(nn.Module):
    """SpecAugment's masks (Park et al. 2019) on features (B, T, n_mels), in training mode only:
    ``freq_masks`` bands of f ~ U{0..freq_width} channels starting at f0 ~ U{0..n_mels - f}, and
    ``time_masks`` spans of t ~ U{0..min(time_width, floor(time_ratio T_b))} frames starting at
    t0 ~ U{0..T_b - t}, T_b an example's own length (``lengths``, else T), set to ``value``. The
    draws come from ``generator`` (on the CPU: the same seed, the same masks on any device)."""

    def __init__(
        self,
        freq_masks: int = 2,
        freq_width: int = 27,
        time_masks: int = 2,
        time_width: int = 100,
        time_ratio: float = 1.0,
        value: float = 0.0,
    ):
        super().__init__()
        for name, v in (
            ("freq_masks", freq_masks),
            ("freq_width", freq_width),
            ("time_masks", time_masks),
            ("time_width", time_width),
        ):
            if v < 0:
                raise ValueError(f"{name} ({v}) must be >= 0")
        if not 0.0 <= time_ratio <= 1.0:
            raise ValueError(f"time_ratio ({time_ratio}) must be in [0, 1]")
        self.freq_masks, self.freq_width, self.time_masks, self.time_width = (
            freq_masks,
            freq_width,
            time_masks,
            time_width,
        )
        self.time_ratio, self.value = time_ratio, value

    def spans(
        self,
        batch: int,
        frames: int,
        n_mels: int,
        lengths: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The masks drawn for a batch, on the CPU: time (B, time_masks, 2) and frequency
        (B, freq_masks, 2) spans as (start, width)."""
        n = torch.full((batch,), frames) if lengths is None else lengths.detach().to("cpu", torch.long)
        t_max = torch.clamp(torch.floor(self.time_ratio * n).long(), max=self.time_width)  # (B,)
        f_max = torch.full((batch,), min(self.freq_width, n_mels))
        return _draw(n, t_max, self.time_masks, generator), _draw(
            torch.full((batch,), n_mels), f_max, self.freq_masks, generator
        )

    def forward(
        self, features: Tensor, lengths: Tensor | None = None, generator: torch.Generator | None = None
    ) -> Tensor:
        if not self.training or (self.time_masks == 0 and self.freq_masks == 0):
            return features
        b, t, f = features.shape
        time, freq = (s.to(features.device) for s in self.spans(b, t, f, lengths, generator))
        masked = _covered(time, t)[:, :, None] | _covered(freq, f)[:, None, :]  # (B, T, F)
        return features.masked_fill(masked, self.value)


def _draw(n: Tensor, most: Tensor, count: int, generator: torch.Generator | None) -> Tensor:
    """``count`` spans per row: width w ~ U{0..most}, start ~ U{0..n - w}; (B, count, 2) of (start, width)."""
    u = torch.rand((len(n), count, 2), generator=generator, dtype=torch.float64)
    width = torch.floor(u[..., 0] * (most[:, None] + 1)).long()  # (B, count)
    start = torch.floor(u[..., 1] * (n[:, None] - width + 1)).long()
    return torch.stack([start, width], dim=-1)


def _covered(spans: Tensor, size: int) -> Tensor:
    """(B, size) True where any of the (B, k, 2) spans covers a position."""
    pos = torch.arange(size, device=spans.device)  # (size,)
    start, width = spans[..., 0:1], spans[..., 1:2]  # (B, k, 1)
    return ((pos >= start) & (pos < start + width)).any(dim=1)


def _check(name: str, value: object, valid: tuple[object, ...]) -> None:
    if value not in valid:
        raise ValueError(f"{name} {value!r} is not one of {', '.join(map(repr, valid))}")
