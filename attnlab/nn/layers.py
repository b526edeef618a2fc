"""Encoder and decoder layers, assembled from parts built elsewhere (models/transformer.py).

EncoderLayer:  x -> Residual(SelfAttention) -> Residual(FFN)
DecoderLayer:  y -> Residual(MaskedSelfAttention) -> Residual(CrossAttention over the encoder
               output) -> Residual(FFN); without cross-attention it is a GPT-style block.

Either layer without a feed-forward sublayer (None, the ablation ``ffn: false``) stops after attention.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.cache import KVCache
from attnlab.nn.feedforward import PositionWiseFeedForward
from attnlab.nn.masks import AttentionMask
from attnlab.nn.residual import ResidualConnection

Positions = tuple[Tensor, Tensor]  # (Tq,) query positions, (Tk,) key positions


class EncoderLayer(nn.Module):
    """Self-attention over the whole sequence, then the position-wise FFN, each in a residual block."""

    def __init__(self, self_attn: MultiHeadAttention, feed_forward: PositionWiseFeedForward | None,
                 self_attn_residual: ResidualConnection, feed_forward_residual: ResidualConnection | None) -> None:
        super().__init__()
        self.self_attn, self.self_attn_residual = self_attn, self_attn_residual
        self.feed_forward, self.feed_forward_residual = feed_forward, feed_forward_residual

    def forward(self, x: Tensor, mask: AttentionMask | Tensor, positions: Positions) -> Tensor:
        """x: (B, T, d_model); mask: an AttentionMask (or bool, broadcastable to (B, H, T, T))."""
        x = self.self_attn_residual(x, lambda h: self.self_attn(h, mask=mask, positions=positions)[0])
        return x if self.feed_forward is None else self.feed_forward_residual(x, self.feed_forward)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output (absent in a decoder-only
    model), then the FFN, each in a residual block; self-attention keys/values can be cached."""

    def __init__(self, self_attn: MultiHeadAttention, cross_attn: MultiHeadAttention | None,
                 feed_forward: PositionWiseFeedForward | None, self_attn_residual: ResidualConnection,
                 cross_attn_residual: ResidualConnection | None, feed_forward_residual: ResidualConnection | None
                 ) -> None:
        super().__init__()
        self.self_attn, self.self_attn_residual = self_attn, self_attn_residual
        self.cross_attn, self.cross_attn_residual = cross_attn, cross_attn_residual
        self.feed_forward, self.feed_forward_residual = feed_forward, feed_forward_residual

    def forward(self, y: Tensor, self_mask: AttentionMask | Tensor, positions: Positions, memory: Tensor | None = None,
                memory_mask: AttentionMask | Tensor | None = None, self_cache: KVCache | None = None,
                cross_cache: KVCache | None = None, memory_positions: Tensor | None = None) -> Tensor:
        """y: (B, Tq, d_model) target vectors (only the new steps when decoding with a cache);
        self_mask: causal and padding; memory: (B, S, d_model); memory_mask: its padding (AttentionMasks);
        memory_positions: (S,), made once by the stack for all its layers (else by cross-attention)."""
        y = self.self_attn_residual(
            y, lambda h: self.self_attn(h, mask=self_mask, positions=positions, cache=self_cache)[0])
        if self.cross_attn is not None:
            y = self.cross_attn_residual(
                y, lambda h: self.cross_attn(h, memory=memory, mask=memory_mask, cache=cross_cache,
                                             positions=None if memory_positions is None
                                             else (positions[0], memory_positions))[0])
        return y if self.feed_forward is None else self.feed_forward_residual(y, self.feed_forward)

    def memory_keys_values(self, states: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Transformer-XL's memory (nn/memory.py): the self-attention keys and values, (B, H, M, Dh) each,
        of (B, M, d_model) states that entered this layer at earlier (M,) positions, read as
        self-attention reads its input (normalised first in a pre-norm block)."""
        residual = self.self_attn_residual
        return self.self_attn.keys_values(residual.norm(states) if residual.pre_norm else states, positions)
