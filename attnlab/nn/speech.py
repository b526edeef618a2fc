"""Speech recognisers over Whisper's encoder (Radford et al. 2022), which reads the log-mel frames of the
waveform (nn/audio.py's FrameEncoding: a strided convolutional stem, sinusoidal positions, a pre-norm
stack) into frame tokens; two ways to write the transcript from them:

    memory = FrameEncoder(waveform)                                (B, T, d_model), T = ceil(F / 2)
    logits = Generator(Decoder(Embed(BOS y_1 ... y_{T-1}), memory)) SpeechRecognizer: Whisper's decoder
    log P(symbol | frame t) = log_softmax(memory_t W + b)          CTCRecognizer: CTC (Graves et al. 2006)

The first has the encoder-decoder's interface (``encode``, ``decode``, ``new_cache``), so teacher forcing,
greedy and beam search and the KV cache (decode/search.py) work on it as on a translation model: only
the source is a batch of zero-padded waveforms (B, S), each clip ending at its last non-zero sample
(:func:`clip_lengths`), so that a source is one tensor, as a sentence of ids is.

What the encoder reads of a clip is a part of its own (``clips``): its own frames, the padding after it
masked (:class:`OwnFrames`, attnlab's), or, as Whisper, the clip padded with silence to a fixed window
and every frame of the window, the silence too (:class:`WindowFrames`: Whisper's encoder has no mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.audio import ConvStem, FrameEncoding, Spectrogram
from attnlab.nn.embeddings import Embeddings
from attnlab.nn.encoder_decoder import TransformerTargetSide
from attnlab.nn.layers import Encoder, Seq2SeqDecoder
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.tensor_plan import TensorPlan, megatron
from attnlab.nn.vision import PatchMean


def clip_lengths(waveforms: Tensor) -> Tensor:
    """(B, S) zero-padded waveforms -> (B,) each clip's samples, up to its last non-zero one (1 for a
    silent clip): trailing digital silence and padding are one."""
    sounding = waveforms != 0  # (B, S)
    after_last = waveforms.shape[1] - sounding.flip(1).int().argmax(1)  # (B,): one past the last sounding sample
    return torch.where(sounding.any(1), after_last, torch.ones_like(after_last))


class OwnFrames(nn.Module):
    """(B, S) zero-padded waveforms -> the same waveforms and (B,) each clip's own samples: the encoder
    masks the frames after a clip's end."""

    def forward(self, waveforms: Tensor) -> tuple[Tensor, Tensor]:
        return waveforms, clip_lengths(waveforms)


class WindowFrames(nn.Module):
    """(B, S) zero-padded waveforms, S <= ``samples`` -> (B, samples), every clip padded with silence to
    the window, and (B,) the window's length: the encoder reads every frame (Whisper's 30 s window)."""

    def __init__(self, samples: int) -> None:
        super().__init__()
        self.samples = samples

    def forward(self, waveforms: Tensor) -> tuple[Tensor, Tensor]:
        padded = F.pad(waveforms, (0, self.samples - waveforms.shape[1]))  # (B, samples)
        return padded, torch.full_like(padded[:, 0], self.samples, dtype=torch.long)


class SpeechRecognizer(FrameEncoding, TransformerTargetSide):
    """``model(waveforms, tgt_in)``: (B, S) zero-padded waveforms, (B, T) ids BOS y_1 ... -> (B, T, V) logits."""

    def __init__(
        self,
        clips: OwnFrames | WindowFrames,
        spectrogram: Spectrogram,
        stem: ConvStem,
        positional: PositionalEncoding,
        encoder: Encoder,
        tgt_embed: Embeddings,
        decoder: Seq2SeqDecoder,
        generator: nn.Module,
        pad_id: int,
    ) -> None:
        super().__init__()
        self.clips, self.spectrogram, self.stem, self.positional = clips, spectrogram, stem, positional
        self.summary, self.encoder = PatchMean(0), encoder  # no class token: every frame token is a key
        self.tgt_embed, self.decoder, self.generator = tgt_embed, decoder, generator
        self.pad_id = pad_id

    def encode(self, waveforms: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S) -> memory (B, T, d_model), the frame tokens' final states, and its (B, T) validity:
        True at the tokens the encoder reads (``clips``)."""
        return self.encode_waveforms(*self.clips(waveforms))

    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of the encoder's and the decoder's layers (train.strategy tp, nn/tensor_plan.py)."""
        return megatron(self, "encoder", "decoder")


class CTCRecognizer(FrameEncoding):
    """An encoder-only recogniser read by CTC (decode/ctc.py): each frame token's distribution over the
    vocabulary, whose PAD id is the blank (never a target; wav2vec 2.0's <pad> is its blank too).
    ``model.ctc_log_probs(waveforms)``: (B, S) zero-padded -> (B, T, V) log-probabilities and (B,) each
    clip's frame tokens."""

    def __init__(
        self,
        spectrogram: Spectrogram,
        stem: ConvStem,
        positional: PositionalEncoding,
        encoder: Encoder,
        output: nn.Linear,
        blank: int,
    ) -> None:
        super().__init__()
        self.spectrogram, self.stem, self.positional = spectrogram, stem, positional
        self.summary, self.encoder = PatchMean(0), encoder
        self.output, self.blank = output, blank

    def ctc_log_probs(self, waveforms: Tensor) -> tuple[Tensor, Tensor]:
        h, valid = self.encode_waveforms(waveforms, clip_lengths(waveforms))  # (B, T, d_model), (B, T)
        return F.log_softmax(self.output(h).float(), dim=-1), valid.sum(1)  # (B, T, V), (B,)
