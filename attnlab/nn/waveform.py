"""The raw waveform as tokens: frames of samples, at one rate or at several (the seed's hierarchy).

    x_s     = Decimate_s(normalise(waveform))    the stream at 1 / s of the data's rate, s in 1, r, r^2, ...
    tokens  = [W_s frame_k(x_s) for each stream s, coarse first]      (B, N, d_model), one linear map per stream
    position of token k of stream s = k s                            in frames of the finest stream

A stream is decimated through scipy.signal.resample_poly's anti-aliasing filter (a Kaiser-windowed
sinc), not by keeping every s-th sample (``audio[::100]`` folds everything above the new Nyquist back
into the band). Each clip is first brought to zero mean and unit variance over its own samples
(transformers' Wav2Vec2FeatureExtractor, ``do_normalize``), and the samples past its end, in every
stream, are zeros, so that a clip's tokens are the same alone as beside a longer clip.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.audio import TokenEncoding
from attnlab.nn.layers import Encoder
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.vision import ClassToken, PatchMean


def lowpass_taps(factor: int) -> Tensor:
    """resample_poly's filter for decimation by ``factor``: firwin(20 factor + 1, 1 / factor,
    window=('kaiser', 5.0)), a sinc cut at the new Nyquist frequency under a Kaiser window, with unit
    gain at 0 Hz. (20 factor + 1,) float32."""
    half = 10 * factor
    n = torch.arange(-half, half + 1, dtype=torch.float64)
    h = (
        torch.sinc(n / factor)
        / factor
        * torch.kaiser_window(2 * half + 1, periodic=False, beta=5.0, dtype=torch.float64)
    )
    return (h / h.sum()).float()


class Decimation(nn.Module):
    """(B, S) -> (B, ceil(S / factor)): the filtered signal at every ``factor``-th sample, centred
    as resample_poly(x, 1, factor) centres it (zeros beyond both ends)."""

    taps: Tensor  # (1, 1, 20 factor + 1): lowpass_taps, a buffer that moves with the model

    def __init__(self, factor: int) -> None:
        super().__init__()
        self.factor = factor
        self.register_buffer("taps", lowpass_taps(factor)[None, None], persistent=False)  # (1, 1, 20 s + 1)

    def forward(self, x: Tensor) -> Tensor:
        return F.conv1d(x[:, None], self.taps.to(x.dtype), stride=self.factor, padding=10 * self.factor)[:, 0]


def normalised(waveforms: Tensor, lengths: Tensor, eps: float = 1e-7) -> Tensor:
    """(B, S), (B,) -> each clip at zero mean and unit variance over its own samples, zeros past its end."""
    inside = (torch.arange(waveforms.shape[1], device=waveforms.device)[None, :] < lengths[:, None]).to(waveforms.dtype)
    n = lengths[:, None].to(waveforms.dtype)  # (B, 1)
    mean = (waveforms * inside).sum(1, keepdim=True) / n
    var = ((waveforms - mean) ** 2 * inside).sum(1, keepdim=True) / n
    return (waveforms - mean) / torch.sqrt(var + eps) * inside


class WaveformTokens(nn.Module):
    """(B, S) waveforms, (B,) lengths in samples -> (B, N, d_model) tokens, their (N,) positions and
    (B, N) validity: ``frame`` samples a token, in each stream of ``factors`` (coarse first)."""

    def __init__(self, frame: int, factors: list[int], d_model: int) -> None:
        super().__init__()
        self.frame, self.factors = frame, factors
        self.decimations = nn.ModuleList(Decimation(s) if s > 1 else nn.Identity() for s in factors)  # 1: as it is
        self.embeddings = nn.ModuleList(nn.Linear(frame, d_model) for _ in factors)

    def forward(self, waveforms: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = normalised(waveforms, lengths)  # (B, S)
        tokens, positions, valid = [], [], []
        for s, decimate, embed in zip(self.factors, self.decimations, self.embeddings):
            stream, samples = decimate(x), (lengths + s - 1) // s  # (B, ceil(S / s)), (B,): ceil(L / s)
            stream = stream * (torch.arange(stream.shape[1], device=x.device)[None, :] < samples[:, None])
            n = (stream.shape[1] + self.frame - 1) // self.frame  # tokens of the longest clip
            frames = F.pad(stream, (0, n * self.frame - stream.shape[1])).view(-1, n, self.frame)  # (B, n, frame)
            tokens.append(embed(frames))  # (B, n, d_model)
            k = torch.arange(n, device=x.device)
            positions.append(k * s)
            valid.append(k[None, :] < ((samples + self.frame - 1) // self.frame)[:, None])
        return torch.cat(tokens, 1), torch.cat(positions), torch.cat(valid, 1)


class WaveformTransformer(TokenEncoding):
    """The raw waveform's frames as tokens, at one or several rates, read by the Encoder stack as a
    classifier: tokens + sinusoids of their time, [x_class;] tokens, the stack, the head."""

    def __init__(
        self,
        tokens: WaveformTokens,
        positional: PositionalEncoding,
        summary: ClassToken | PatchMean,
        encoder: Encoder,
        classifier: nn.Module,
    ) -> None:
        super().__init__(positional, summary, encoder, classifier)
        self.tokens = tokens

    def encode(self, waveforms: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        x, positions, valid = self.tokens(waveforms, lengths)  # (B, N, d_model), (N,), (B, N)
        return self.encode_tokens(x, positions, valid)
