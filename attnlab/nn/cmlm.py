"""The conditional masked language model of Mask-Predict (Ghazvininejad et al. 2019).

An encoder-decoder whose decoder is not causal: it reads the whole target, some of its tokens
replaced by <mask>, and predicts every position at once; and a length predictor on the encoder:

    memory = Encoder(Embed(x))
    P(y_i | x, y_obs) = softmax(Generator(Decoder(Embed(y_obs), memory))_i)     (every position sees every other)
    P(N | x)          = softmax(W mean_j(memory_j) + b),  N = 1 .. max_length

The paper reads the length from the output of a LENGTH token prepended to the source (as BERT's
CLS); this model reads it from the mean of the encoder's states at the real source tokens
(``MeanPooling``), so that the source needs no extra token and the decoder no extra key to ignore.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.nn.embeddings import Embeddings
from attnlab.nn.encoder_decoder import EncoderDecoder
from attnlab.nn.layers import Encoder, Seq2SeqDecoder
from attnlab.nn.pooling import MeanPooling


class LengthPredictor(nn.Module):
    """P(N | x) = softmax(W mean_j(h_j) + b) over N = 1 .. max_length: column k is the length k + 1."""

    def __init__(self, d_model: int, max_length: int) -> None:
        super().__init__()
        self.pooling = MeanPooling()
        self.out = nn.Linear(d_model, max_length)
        self.max_length = max_length

    def forward(self, memory: Tensor, valid: Tensor) -> Tensor:
        """(B, S, d_model) encoder states, (B, S) True at real tokens -> (B, max_length) logits."""
        return self.out(self.pooling(memory, valid))

    def classes(self, lengths: Tensor) -> Tensor:
        """(B,) target lengths -> (B,) their columns; a length beyond max_length counts as max_length."""
        return lengths.clamp(max=self.max_length) - 1


class ConditionalMaskedLM(EncoderDecoder):
    """``model(src, tgt)`` -> ((B, T, V) token logits at every target position, (B, max_length)
    length logits). ``encode`` and ``decode`` are the encoder-decoder's, over a non-causal decoder;
    ``length_loss_weight``: the length loss's weight in training (the paper's 0.1)."""

    def __init__(
        self,
        src_embed: Embeddings,
        tgt_embed: Embeddings,
        encoder: Encoder,
        decoder: Seq2SeqDecoder,
        generator: nn.Linear,
        length_predictor: LengthPredictor,
        pad_id: int,
        length_loss_weight: float,
    ) -> None:
        super().__init__(src_embed, tgt_embed, encoder, decoder, generator, pad_id)
        self.length_predictor = length_predictor
        self.length_loss_weight = length_loss_weight

    def forward(self, src: Tensor, tgt: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        """(B, S) source ids (+ EOS), (B, T) target ids, some of them <mask> -> (B, T, V), (B, max_length)."""
        memory, src_valid = self.encode(src)
        return self.decode(tgt, memory, src_valid), self.length_predictor(memory, src_valid)
