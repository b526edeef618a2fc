"""The encoder and decoder stacks: layers applied in order under one mask, then a final norm.

Encoder         EncoderLayers over the whole sequence (padding masked, or any other mask given)
Decoder         DecoderLayers under a causal mask: the decoder-only model's stack
Seq2SeqDecoder  Seq2SeqDecoderLayers, cross-attending to the encoder's output; causal, or with
                ``causal=False`` every target position seeing every other (nn/cmlm.py)

A decoder accepts a :class:`DecoderCache`: with one, it takes only the new steps.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.nn.cache import DecoderCache, KVCache, StaticDecoderCache
from attnlab.nn.layers import DecoderLayer, EncoderLayer, EncoderOutput, Seq2SeqDecoderLayer
from attnlab.nn.masks import AttentionMask


class LayerStack(nn.Module):
    """Layers applied in order, optionally with activation checkpointing in training (keep only
    each layer's input and recompute its inside during the backward pass)."""

    def __init__(self, layers: list[nn.Module], norm: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.checkpoint_activations = False

    def run_layer(self, layer: nn.Module, *args) -> Tensor:
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

    def __init__(self, layers: list[DecoderLayer], norm: nn.Module, causal: bool = True) -> None:
        super().__init__(layers, norm)
        self.causal = causal

    def forward(self, y: Tensor, valid: Tensor, positions: Tensor, cache: DecoderCache | None = None) -> Tensor:
        """y: (B, T, d_model) at (T,) positions (only the steps after the cached ones, with a cache);
        valid: (B, T) -> (B, T, d_model)."""
        mask, k_positions = self.self_attention_mask(valid, cache, y.device)
        for i, layer in enumerate(self.layers):
            y = self.run_layer(layer, y, mask, (positions, k_positions), self.layer_cache(cache, i))
        return self.norm(y)

    def self_attention_mask(self, valid: Tensor, cache: DecoderCache | None,
                            device: torch.device) -> tuple[AttentionMask, Tensor]:
        """The self-attention's mask over the (Tk,) keys, cached steps and these (a static cache: all
        its capacity), and their positions; built once for all the layers."""
        valid = valid if cache is None else cache.extend(valid)  # (B, Tk)
        return (AttentionMask(key_valid=self.keys_to_mask(valid), causal=self.causal),
                torch.arange(valid.shape[1], device=device))

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

    def forward(self, y: Tensor, valid: Tensor, positions: Tensor, memory: Tensor,  # type: ignore[override]
                memory_valid: Tensor, cache: DecoderCache | None = None) -> Tensor:
        """y: (B, T, d_model) at (T,) positions; valid: (B, T); memory: (B, S, d_model) with
        memory_valid (B, S). With a cache, y holds only the steps after the cached ones, and the
        source mask of the first step is kept with the cached source keys (and reordered with them)."""
        mask, k_positions = self.self_attention_mask(valid, cache, y.device)
        memory_valid = memory_valid if cache is None else cache.source_valid(memory_valid)
        source = EncoderOutput(memory, AttentionMask(key_valid=memory_valid),
                               torch.arange(memory.shape[1], device=y.device))
        for i, layer in enumerate(self.layers):
            y = self.run_layer(layer, y, mask, (positions, k_positions), source, self.layer_cache(cache, i),
                               None if cache is None else cache.cross_attn[i])
        return self.norm(y)
