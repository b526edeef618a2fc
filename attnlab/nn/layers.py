"""A Transformer layer, and stacks of them: the residual blocks around the sublayers, the encoder
and decoder layers assembled from parts built elsewhere (models/transformer.py), and the stacks that
apply them in order under one mask, then a final norm.

Residual blocks, in either placement:

    post (the paper):  x_out = Norm(x + Dropout(Sublayer(x)))
    pre:               x_out = x + Dropout(Sublayer(Norm(x)))

Norm is LayerNorm (each token over its d_model features), TokenBatchNorm (each feature over every
token of the batch), which PatchTST uses for time series, or NoNorm (the ablation without it).
NoResidual is the ablation without the skip: Norm(Dropout(Sublayer(x))), or Dropout(Sublayer(Norm(x))).

Layers:

    EncoderLayer:         x -> Residual(SelfAttention) -> Residual(FFN)
    DecoderLayer:         the decoder-only (GPT) block: the same sublayers under a causal mask, whose
                          self-attention keys and values can be cached when decoding
    Seq2SeqDecoderLayer:  the encoder-decoder's: y -> Residual(MaskedSelfAttention) -> Residual(CrossAttention
                          over the encoder output) -> Residual(FFN)

A layer without a feed-forward sublayer (None, the ablation ``ffn: false``) stops after attention.

Stacks:

    Encoder         EncoderLayers over the whole sequence (padding masked, or any other mask given)
    Decoder         DecoderLayers under a causal mask: the decoder-only model's stack
    Seq2SeqDecoder  Seq2SeqDecoderLayers, cross-attending to the encoder's output; causal, or with
                    ``causal=False`` every target position seeing every other (nn/cmlm.py)

A decoder accepts a :class:`DecoderCache`: with one, it takes only the new steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence, cast

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.nn.attention import CrossAttention, SelfAttention
from attnlab.nn.cache import DecoderCache, KVCache, StaticDecoderCache
from attnlab.nn.dropout import Dropout
from attnlab.nn.feedforward import PositionWiseFeedForward
from attnlab.nn.masks import AttentionMask

# -- residual blocks ------------------------------------------------------------------------------


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm over tokens: each of the d_model features standardised with its mean and variance
    over all B T tokens of the batch (running estimates in eval mode), then a learned gain and bias.
    Padding would count as tokens: for inputs without padding only (PatchTST's patches)."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__(d_model, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        return super().forward(x.flatten(0, -2)).view_as(x)


class NoNorm(nn.Identity):
    """No normalisation: the ablation of the norms."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()


class ResidualConnection(nn.Module):
    """A sublayer wrapped in dropout, a residual sum and a ``normalisation`` (LayerNorm by default),
    placed after ('post') or before ('pre')."""

    def __init__(
        self,
        d_model: int,
        dropout: float,
        placement: str,
        eps: float = 1e-5,
        normalisation: type[nn.Module] = nn.LayerNorm,
    ) -> None:
        super().__init__()
        self.norm = normalisation(d_model, eps=eps)
        self.dropout = Dropout(dropout)
        self.pre_norm = {"pre": True, "post": False}[placement]

    def forward(self, x: Tensor, sublayer: Callable[..., Tensor], *args: Any) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model); the sublayer is called with ``args`` after its input."""
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x), *args))
        return self.norm(x + self.dropout(sublayer(x, *args)))


class NoResidual(ResidualConnection):
    """The ablation without the residual sum: the sublayer's output replaces its input."""

    def forward(self, x: Tensor, sublayer: Callable[..., Tensor], *args: Any) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        if self.pre_norm:
            return self.dropout(sublayer(self.norm(x), *args))
        return self.norm(self.dropout(sublayer(x, *args)))


# -- layers ---------------------------------------------------------------------------------------

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

    def __init__(
        self,
        self_attn: SelfAttention,
        feed_forward: PositionWiseFeedForward | None,
        self_attn_residual: ResidualConnection,
        feed_forward_residual: ResidualConnection | None,
    ) -> None:
        super().__init__()
        self.self_attn, self.self_attn_residual = self_attn, self_attn_residual
        self.feed_forward, self.feed_forward_residual = feed_forward, feed_forward_residual

    def forward(self, x: Tensor, mask: AttentionMask | Tensor, positions: Positions) -> Tensor:
        """x: (B, T, d_model); mask: an AttentionMask (or bool, broadcastable to (B, H, T, T))."""
        # pre-norm: x = x + SelfAttention(Norm(x)); x = x + FFN(Norm(x))   (post-norm: Norm(x + ...))
        x = self.self_attn_residual(x, self.self_attn, mask, positions)  # (B, T, d_model)
        return self.position_wise(x)  # (B, T, d_model)

    def position_wise(self, x: Tensor) -> Tensor:
        """x + FFN(x) in its residual block; x itself without a feed-forward sublayer."""
        # the residual block is None only with the sublayer (models/transformer.py's feed_forward)
        residual = cast(ResidualConnection, self.feed_forward_residual)
        return x if self.feed_forward is None else residual(x, self.feed_forward)


class DecoderLayer(EncoderLayer):
    """The decoder-only (GPT) block: an encoder layer's sublayers, its mask causal, its
    self-attention's keys and values cached between decoding steps."""

    def forward(
        self, y: Tensor, mask: AttentionMask | Tensor, positions: Positions, cache: KVCache | None = None
    ) -> Tensor:
        """y: (B, T, d_model) (only the new steps with a cache); mask: causal and padding, over the
        (Tk,) cached and new keys of ``positions`` -> (B, T, d_model)."""
        # pre-norm: y = y + SelfAttention(Norm(y)); y = y + FFN(Norm(y))   (post-norm: Norm(y + ...))
        y = self.self_attn_residual(y, self.self_attn, mask, positions, cache)  # (B, T, d_model)
        return self.position_wise(y)  # (B, T, d_model)

    def memory_keys_values(self, states: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Transformer-XL's memory (nn/memory.py): the self-attention keys and values, (B, H, M, Dh) each,
        of (B, M, d_model) states that entered this layer at earlier (M,) positions, read as
        self-attention reads its input (normalised first in a pre-norm block)."""
        residual = self.self_attn_residual
        return self.self_attn.keys_values(residual.norm(states) if residual.pre_norm else states, positions)


class Seq2SeqDecoderLayer(DecoderLayer):
    """The encoder-decoder's decoder layer: masked self-attention, cross-attention over the encoder
    output, then the FFN, each in a residual block; both attentions' keys and values can be cached."""

    def __init__(
        self,
        self_attn: SelfAttention,
        cross_attn: CrossAttention,
        feed_forward: PositionWiseFeedForward | None,
        self_attn_residual: ResidualConnection,
        cross_attn_residual: ResidualConnection,
        feed_forward_residual: ResidualConnection | None,
    ) -> None:
        super().__init__(self_attn, None, self_attn_residual, None)
        # registered in the order of the computation (the order init_weights draws in): the FFN last
        self.cross_attn, self.cross_attn_residual = cross_attn, cross_attn_residual
        self.feed_forward, self.feed_forward_residual = feed_forward, feed_forward_residual

    def forward(  # type: ignore[override]
        self,
        y: Tensor,
        mask: AttentionMask | Tensor,
        positions: Positions,
        source: EncoderOutput,
        cache: KVCache | None = None,
        source_cache: KVCache | None = None,
    ) -> Tensor:
        """y: (B, T, d_model) target vectors (only the new steps with a cache); mask: causal and
        padding; source: the encoder's output (keys and values of the cross-attention, which
        ``source_cache`` keeps once projected) -> (B, T, d_model)."""
        y = self.self_attn_residual(y, self.self_attn, mask, positions, cache)  # (B, T, d_model)
        y = self.cross_attn_residual(
            y, self.cross_attn, source.states, source.mask, (positions[0], source.positions), source_cache
        )  # (B, T, d_model)
        return self.position_wise(y)


# -- stacks ---------------------------------------------------------------------------------------


class LayerStack(nn.Module):
    """Layers applied in order, optionally with activation checkpointing in training (keep only
    each layer's input and recompute its inside during the backward pass)."""

    def __init__(self, layers: Sequence[nn.Module], norm: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.checkpoint_activations = False

    def run_layer(self, layer: nn.Module, *args: Any) -> Tensor:
        if self.checkpoint_activations and self.training:
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)


class Encoder(LayerStack):
    """A stack of EncoderLayers; ``norm`` is a final LayerNorm for pre-norm stacks, else identity."""

    def __init__(self, layers: list[EncoderLayer], norm: nn.Module) -> None:
        super().__init__(layers, norm)

    def forward(self, x: Tensor, valid: Tensor, positions: Tensor, allowed: Tensor | None = None) -> Tensor:
        """x: (B, S, d_model); valid: (B, S) True for real tokens; positions: (S,); allowed: a
        boolean mask broadcastable to (B, H, S, S) of who may attend to whom besides padding (a
        graph's neighbourhoods), or None -> (B, S, d_model)."""
        mask = AttentionMask(key_valid=valid, explicit=allowed)
        for layer in self.layers:
            x = self.run_layer(layer, x, mask, (positions, positions))
        return self.norm(x)


class Decoder(LayerStack):
    """A stack of DecoderLayers under a causal mask (``causal=False``: every position sees every
    other, padding still masked); with a cache, over the cached steps and the new ones."""

    def __init__(self, layers: Sequence[DecoderLayer], norm: nn.Module, causal: bool = True) -> None:
        super().__init__(layers, norm)
        self.causal = causal

    def forward(self, y: Tensor, valid: Tensor, positions: Tensor, cache: DecoderCache | None = None) -> Tensor:
        """y: (B, T, d_model) at (T,) positions (only the steps after the cached ones, with a cache);
        valid: (B, T) -> (B, T, d_model)."""
        mask, k_positions = self.self_attention_mask(valid, cache, y.device)
        for i, layer in enumerate(self.layers):
            y = self.run_layer(layer, y, mask, (positions, k_positions), self.layer_cache(cache, i))
        return self.norm(y)

    def self_attention_mask(
        self, valid: Tensor, cache: DecoderCache | None, device: torch.device
    ) -> tuple[AttentionMask, Tensor]:
        """The self-attention's mask over the (Tk,) keys, cached steps and these (a static cache: all
        its capacity), and their positions; built once for all the layers."""
        valid = valid if cache is None else cache.extend(valid)  # (B, Tk)
        return (
            AttentionMask(key_valid=self.keys_to_mask(valid), causal=self.causal),
            torch.arange(valid.shape[1], device=device),
        )

    def keys_to_mask(self, valid: Tensor) -> Tensor | None:
        """(B, Tk) real keys -> the padding the self-attention must mask. A causal decoder masks
        none: padding only ever follows a row's real tokens (right padding; rows that leave a decode
        are fed padding), so causality already hides every padding key from every real query. Only
        the padding positions' own outputs change, and nothing reads them (the losses skip PAD
        targets). The fused kernels then get ``is_causal`` and no mask tensor. A non-causal decoder
        (nn/cmlm.py) masks ``valid``."""
        return None if self.causal else valid

    @staticmethod
    def layer_cache(cache: DecoderCache | None, i: int) -> KVCache | None:
        return None if cache is None else cache.self_attn[i]

    def new_cache(self, capacity: int | None = None) -> DecoderCache:
        """A growable cache, or with ``capacity`` a static one of that many positions."""
        if capacity is None:
            return DecoderCache(len(self.layers))
        return StaticDecoderCache(len(self.layers), capacity, next(self.parameters()).device)


class Seq2SeqDecoder(Decoder):
    """A stack of Seq2SeqDecoderLayers: the decoder's stack, each layer also cross-attending to the
    encoder's output."""

    def __init__(self, layers: list[Seq2SeqDecoderLayer], norm: nn.Module, causal: bool = True) -> None:
        super().__init__(layers, norm, causal)

    def forward(  # type: ignore[override]
        self,
        y: Tensor,
        valid: Tensor,
        positions: Tensor,
        memory: Tensor,
        memory_valid: Tensor,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """y: (B, T, d_model) at (T,) positions; valid: (B, T); memory: (B, S, d_model) with
        memory_valid (B, S). With a cache, y holds only the steps after the cached ones, and the
        source mask of the first step is kept with the cached source keys (and reordered with them)."""
        mask, k_positions = self.self_attention_mask(valid, cache, y.device)
        memory_valid = memory_valid if cache is None else cache.source_valid(memory_valid)
        source = EncoderOutput(
            memory, AttentionMask(key_valid=memory_valid), torch.arange(memory.shape[1], device=y.device)
        )
        for i, layer in enumerate(self.layers):
            y = self.run_layer(
                layer,
                y,
                mask,
                (positions, k_positions),
                source,
                self.layer_cache(cache, i),
                None if cache is None else cache.cross_attn[i],
            )
        return self.norm(y)
