"""A speech recogniser shaped as Whisper (Radford et al. 2022): the encoder reads the log-mel frames of the
waveform (nn/audio.py's FrameEncoding: a strided convolutional stem, sinusoidal positions, a pre-norm
stack), and the Transformer's decoder writes the transcript, cross-attending to every frame token.

    memory = FrameEncoder(waveform)                                (B, T, d_model), T = ceil(F / 2)
    logits = Generator(Decoder(Embed(BOS y_1 ... y_{T-1}), memory))

It has the encoder-decoder's interface (``encode``, ``decode``, ``new_cache``), so teacher forcing,
greedy and beam search and the KV cache (decode/search.py) work on it as on a translation model: only
the source is a batch of zero-padded waveforms (B, S), each clip ending at its last non-zero sample
(:func:`clip_lengths`), so that a source is one tensor, as a sentence of ids is.
"""

from __future__ import annotations

import torch
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


class SpeechRecognizer(FrameEncoding, TransformerTargetSide):
    """``model(waveforms, tgt_in)``: (B, S) zero-padded waveforms, (B, T) ids BOS y_1 ... -> (B, T, V) logits."""

    def __init__(
        self,
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
        self.spectrogram, self.stem, self.positional = spectrogram, stem, positional
        self.summary, self.encoder = PatchMean(0), encoder  # no class token: every frame token is a key
        self.tgt_embed, self.decoder, self.generator = tgt_embed, decoder, generator
        self.pad_id = pad_id

    def encode(self, waveforms: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S) -> memory (B, T, d_model), the frame tokens' final states, and its (B, T) validity:
        True at each clip's own tokens."""
        return self.encode_waveforms(waveforms, clip_lengths(waveforms))

    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of the encoder's and the decoder's layers (train.strategy tp, nn/tensor_plan.py)."""
        return megatron(self, "encoder", "decoder")
