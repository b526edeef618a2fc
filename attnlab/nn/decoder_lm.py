"""The decoder-only (GPT-style) language model:

    logits = Generator(Decoder(Embed(x)))                              (causal, no cross-attention)
    logits_j = Generator(Head_j(Decoder(Embed(x))))                    token t + 1 + j (multi-token heads)

Padding is found from ``pad_id``. With a :class:`DecoderCache`, pass only the new steps and get
their logits (incremental decoding); ``new_cache(capacity)`` makes a static cache of that many
positions instead, for steps of fixed shapes (CUDA graphs).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.nn.cache import DecoderCache
from attnlab.nn.embeddings import Embeddings
from attnlab.nn.heads import MultiTokenHead
from attnlab.nn.stacks import Decoder


class DecoderLM(nn.Module):
    """A causal language model. ``model(ids)`` -> (B, T, V) logits of each next token; with
    ``heads`` (multi-token prediction), ``model(ids, ahead=True)`` -> (B, T, 1 + k, V): the next
    token's logits, then head j's for token t + 1 + j. ``head_weights``: each head's weight in the
    training loss (1 for the next token)."""

    def __init__(self, embed: Embeddings, decoder: Decoder, generator: nn.Linear, pad_id: int,
                 heads: list[MultiTokenHead] | None = None, head_weight: float = 1.0) -> None:
        super().__init__()
        self.embed, self.decoder, self.generator = embed, decoder, generator
        self.heads = nn.ModuleList(heads or [])
        self.head_weights = (1.0,) + (head_weight,) * len(self.heads)
        self.pad_id = pad_id

    def forward(self, ids: Tensor, cache: DecoderCache | None = None, last_only: bool = False,
                ahead: bool = False) -> Tensor:
        """(B, T) ids (the new steps only, with a cache) -> (B, T, V) logits (``last_only``: (B, 1, V);
        ``ahead``: (B, T or 1, 1 + k, V), every head's)."""
        y = self.states(ids, cache)
        y = y[:, -1:] if last_only else y
        return self.ahead(y) if ahead else self.generator(y)

    def states(self, ids: Tensor, cache: DecoderCache | None = None) -> Tensor:
        """(B, T) ids -> (B, T, d_model): the decoder's output, which every head reads."""
        positions = self.embed.positions(cache.offset if cache is not None else 0, ids.shape[1], ids.device)
        return self.decoder(self.embed(ids, positions), ids != self.pad_id, positions, cache=cache)

    def ahead(self, y: Tensor) -> Tensor:
        """(B, T, d_model) states -> (B, T, 1 + k, V): the next token's logits, then each head's."""
        return torch.stack([self.generator(h) for h in (y, *(head(y) for head in self.heads))], dim=2)

    def new_cache(self, capacity: int | None = None) -> DecoderCache:
        """A growable cache, or a static one of ``capacity`` positions (within max_len)."""
        if capacity is not None:
            self.embed.check_positions(capacity)
        return self.decoder.new_cache(capacity)
