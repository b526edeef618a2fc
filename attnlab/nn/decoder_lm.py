"""The decoder-only (GPT-style) language model:

    logits = Generator(Decoder(Embed(x)))                              (causal, no cross-attention)
    logits_j = Generator(Head_j(Decoder(Embed(x))))                    token t + 1 + j (multi-token heads)

Padding is found from ``pad_id``. With a :class:`DecoderCache`, pass only the new steps and get
their logits (incremental decoding); ``new_cache(capacity)`` makes a static cache of that many
positions instead, for steps of fixed shapes (CUDA graphs).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from attnlab.nn.cache import DecoderCache
from attnlab.nn.embeddings import Embeddings
from attnlab.nn.heads import MultiTokenHead
from attnlab.nn.layers import Decoder, DecoderLayer
from attnlab.nn.stages import Carried, Stage, layer_ranges
from attnlab.nn.tensor_plan import TensorPlan, megatron


class DecoderLM(nn.Module):
    """A causal language model. ``model(ids)`` -> (B, T, V) logits of each next token; with
    ``heads`` (multi-token prediction), ``model(ids, ahead=True)`` -> (B, T, 1 + k, V): the next
    token's logits, then head j's for token t + 1 + j. ``head_weights``: each head's weight in the
    training loss (1 for the next token)."""

    def __init__(
        self,
        embed: Embeddings,
        decoder: Decoder,
        generator: nn.Linear,
        pad_id: int,
        heads: list[MultiTokenHead] | None = None,
        head_weight: float = 1.0,
    ) -> None:
        super().__init__()
        self.embed, self.decoder, self.generator = embed, decoder, generator
        self.heads = nn.ModuleList(heads or [])
        self.head_weights = (1.0,) + (head_weight,) * len(self.heads)
        self.pad_id = pad_id

    def forward(
        self, ids: Tensor, cache: DecoderCache | None = None, last_only: bool = False, ahead: bool = False
    ) -> Tensor:
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

    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of the decoder's layers (train.strategy tp, nn/tensor_plan.py)."""
        return megatron(self, "decoder")

    def stages(self, n: int, head: str = "forward") -> list[LMStage]:
        """The model cut into ``n`` pipeline stages of consecutive layers (nn/stages.py)."""
        return [LMStage(self, layers) for layers in layer_ranges(len(self.decoder.layers), n)]


class LMStage(Stage):
    """Layers ``layers`` of a DecoderLM (its own modules, shared): (B, T) ids into the first stage,
    (B, T, d_model) states between stages, (B, T, V) logits out of the last. A causal decoder masks
    no padding (Decoder.keys_to_mask), so the states are all that a stage carries."""

    def __init__(self, model: DecoderLM, layers: range) -> None:
        super().__init__(layers, len(model.decoder.layers))
        self.embed = model.embed if self.first else None
        self.decoder = Decoder(
            # a Decoder's ModuleList holds the DecoderLayers it was built from
            [cast(DecoderLayer, model.decoder.layers[i]) for i in layers],
            model.decoder.norm if self.last else nn.Identity(),
        )
        self.generator = model.generator if self.last else None

    def enter(self, ids: Tensor) -> Carried:
        embed = cast(Embeddings, self.embed)  # set on the first stage, the only one that enters
        return (embed(ids, torch.arange(ids.shape[1], device=ids.device)),)  # (B, T) -> (B, T, d_model)

    def through(self, x: Tensor) -> Carried:
        no_padding = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)  # (B, T): the states need no ids
        return (self.decoder(x, no_padding, torch.arange(x.shape[1], device=x.device)),)

    def leave(self, x: Tensor) -> Tensor:
        generator = cast(nn.Linear, self.generator)  # set on the last stage, the only one that leaves
        return generator(x)  # (B, T, d_model) -> (B, T, V)
