"""Encoder and decoder layers, assembled from parts built elsewhere (models/transformer.py).

EncoderLayer:         x -> Residual(SelfAttention) -> Residual(FFN)
DecoderLayer:         the decoder-only (GPT) block: the same sublayers under a causal mask, whose
                      self-attention keys and values can be cached when decoding
Seq2SeqDecoderLayer:  the encoder-decoder's: y -> Residual(MaskedSelfAttention) -> Residual(CrossAttention
                      over the encoder output) -> Residual(FFN)

A layer without a feed-forward sublayer (None, the ablation ``ffn: false``) stops after attention.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from attnlab.nn.attention import CrossAttention, SelfAttention
from attnlab.nn.cache import KVCache
from attnlab.nn.feedforward import PositionWiseFeedForward
from attnlab.nn.masks import AttentionMask
from attnlab.nn.residual import ResidualConnection

Positions = tuple[Tensor, Tensor]  # (Tq,) query positions, (Tk,) key positions


@dataclass(frozen=True)
class EncoderOutput:
    """What a decoder cross-attends to: the encoder's states (B, S, d_model), the AttentionMask of
    their padding and their (S,) positions, made once by the stack for all its layers."""

    states: Tensor
    mask: AttentionMask
    positions: Tensor


class EncoderLayer(nn.Module):
    """Self-attention over the whole sequence, then the position-wise FFN, each in a residual block."""

    def __init__(self, self_attn: SelfAttention, feed_forward: PositionWiseFeedForward | None,
                 self_attn_residual: ResidualConnection, feed_forward_residual: ResidualConnection | None) -> None:
        super().__init__()
        self.self_attn, self.self_attn_residual = self_attn, self_attn_residual
        self.feed_forward, self.feed_forward_residual = feed_forward, feed_forward_residual

    def forward(self, x: Tensor, mask: AttentionMask | Tensor, positions: Positions) -> Tensor:
        """x: (B, T, d_model); mask: an AttentionMask (or bool, broadcastable to (B, H, T, T))."""
        x = self.self_attn_residual(x, lambda h: self.self_attn(h, mask=mask, positions=positions)[0])
        return self.position_wise(x)

    def position_wise(self, x: Tensor) -> Tensor:
        """x + FFN(x) in its residual block; x itself without a feed-forward sublayer."""
        return x if self.feed_forward is None else self.feed_forward_residual(x, self.feed_forward)


class DecoderLayer(EncoderLayer):
    """The decoder-only (GPT) block: an encoder layer's sublayers, its mask causal, its
    self-attention's keys and values cached between decoding steps."""

    def forward(self, y: Tensor, mask: AttentionMask | Tensor, positions: Positions,
                cache: KVCache | None = None) -> Tensor:
        """y: (B, T, d_model) (only the new steps with a cache); mask: causal and padding, over the
        (Tk,) cached and new keys of ``positions`` -> (B, T, d_model)."""
        y = self.self_attn_residual(y, lambda h: self.self_attn(h, mask=mask, positions=positions, cache=cache)[0])
        return self.position_wise(y)

    def memory_keys_values(self, states: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Transformer-XL's memory (nn/memory.py): the self-attention keys and values, (B, H, M, Dh) each,
        of (B, M, d_model) states that entered this layer at earlier (M,) positions, read as
        self-attention reads its input (normalised first in a pre-norm block)."""
        residual = self.self_attn_residual
        return self.self_attn.keys_values(residual.norm(states) if residual.pre_norm else states, positions)


class Seq2SeqDecoderLayer(DecoderLayer):
    """The encoder-decoder's decoder layer: masked self-attention, cross-attention over the encoder
    output, then the FFN, each in a residual block; both attentions' keys and values can be cached."""

    def __init__(self, self_attn: SelfAttention, cross_attn: CrossAttention,
                 feed_forward: PositionWiseFeedForward | None, self_attn_residual: ResidualConnection,
                 cross_attn_residual: ResidualConnection, feed_forward_residual: ResidualConnection | None) -> None:
        super().__init__(self_attn, None, self_attn_residual, None)
        # registered in the order of the computation (the order init_weights draws in): the FFN last
        self.cross_attn, self.cross_attn_residual = cross_attn, cross_attn_residual
        self.feed_forward, self.feed_forward_residual = feed_forward, feed_forward_residual

    def forward(self, y: Tensor, mask: AttentionMask | Tensor, positions: Positions,  # type: ignore[override]
                source: EncoderOutput, cache: KVCache | None = None,
                source_cache: KVCache | None = None) -> Tensor:
        """y: (B, T, d_model) target vectors (only the new steps with a cache); mask: causal and
        padding; source: the encoder's output (keys and values of the cross-attention, which
        ``source_cache`` keeps once projected) -> (B, T, d_model)."""
        y = self.self_attn_residual(y, lambda h: self.self_attn(h, mask=mask, positions=positions, cache=cache)[0])
        y = self.cross_attn_residual(y, lambda h: self.cross_attn(
            h, memory=source.states, mask=source.mask, positions=(positions[0], source.positions),
            cache=source_cache)[0])
        return self.position_wise(y)
