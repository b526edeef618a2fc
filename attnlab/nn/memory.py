"""Transformer-XL (Dai et al. 2019): segment-level recurrence with state reuse.

A text is read in segments of T tokens. While it reads segment tau + 1, layer n attends over its
*memory* m^{n-1}_tau, the hidden states that entered the layer at the M positions before the
segment (computed while earlier segments were read, and held with no gradient: SG), as well as
over the segment itself:

    h~^{n-1}_{tau+1} = [SG(m^{n-1}_tau) o h^{n-1}_{tau+1}]                 (concatenation along the positions)
    q = h^{n-1}_{tau+1} W_q,   k = h~^{n-1}_{tau+1} W_k,   v = h~^{n-1}_{tau+1} W_v
    m^{n-1}_{tau+1} = the last M positions of h~^{n-1}_{tau+1}

Layer n's memory was itself computed by layer n - 1 from an earlier memory, so the context grows by
up to M positions a layer: N M positions in all. The positions must be relative (rotary, relative,
relative_bias, alibi, or none): a state keeps the meaning of its position when it moves from the
segment into the memory. In a pre-norm layer the memory is normalised with the segment before its
keys and values are projected, as the self-attention's input always is.

- :class:`SegmentMemory`: m_tau, carried from one segment to the next (training and evaluation over
  consecutive segments);
- :class:`MemoryDecoder`: the stack of DecoderLayers that reads a segment after its memory, or
  decodes new steps with a :class:`MemoryCache`;
- :class:`MemoryCache`: incremental decoding. A token at position p of segment s = p // T sees the
  keys at positions s T - M .. p, the window that reading segment by segment gives it, so a cached
  decode computes what reading the stored segments again would (in eval mode: the keys a memory
  state would give are those its position gave when it was new). Keys that no later position can
  see are forgotten, so a step costs O(M + T) attention however long the text;
- :class:`TransformerXL`: the language model.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from attnlab.nn.cache import DecoderCache
from attnlab.nn.embeddings import Embeddings
from attnlab.nn.layers import DecoderLayer, LayerStack
from attnlab.nn.masks import AttentionMask
from attnlab.nn.tensor_plan import TensorPlan, megatron


class SegmentMemory:
    """m_tau: for each layer, the hidden states that entered it at the last (at most M) positions read,
    (B, m, d_model) and detached (no gradient flows into an earlier segment), and which of those
    positions are real tokens, (B, m). Empty before the first segment. ``model(ids, memory=m)`` reads
    ``ids`` after what ``m`` remembers and leaves in ``m`` what the next segment is to attend to."""

    def __init__(self) -> None:
        self.states: list[Tensor] = []  # per layer (B, m, d_model): h^{n-1} at the remembered positions
        self.valid: Tensor | None = None  # (B, m) True for real tokens

    @property
    def length(self) -> int:
        """m, the number of positions remembered."""
        return 0 if self.valid is None else self.valid.shape[1]

    def remember(self, entered: list[Tensor], valid: Tensor, length: int) -> None:
        """m_{tau+1}: per layer, the last ``length`` positions of [m_tau; h_{tau+1}], for (B, T, d_model)
        states that ``entered`` each layer in the segment just read and (B, T) ``valid``."""
        old = self.states or [h[:, :0] for h in entered]
        old_valid = valid[:, :0] if self.valid is None else self.valid
        first = max(0, self.length + valid.shape[1] - length)  # the oldest position kept
        self.states = [torch.cat([m, h], dim=1)[:, first:].detach() for m, h in zip(old, entered)]
        self.valid = torch.cat([old_valid, valid], dim=1)[:, first:]


class MemoryKV:
    """A layer's memory as keys and values (B, H, m, Dh) for the pass over one segment. The attention
    backends take it where they take a cache: the segment's keys and values follow the memory's in
    what self-attention attends over, and nothing is kept."""

    def __init__(self, k: Tensor, v: Tensor) -> None:
        self.k, self.v = k, v

    def append(self, k: Tensor, v: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(B, H, T, Dh) keys and values of the segment -> (B, H, m + T, Dh): the memory's, then these."""
        return torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)


class MemoryCache(DecoderCache):
    """Transformer-XL's decoding cache: per layer, the keys and values of the positions still in some
    later position's window (:func:`window_start`); earlier ones are forgotten before new steps come.
    ``length`` counts every position fed, forgotten ones included (the next position)."""

    def __init__(self, n_layers: int, segment_length: int, memory_length: int) -> None:
        super().__init__(n_layers)
        self.segment_length, self.memory_length = segment_length, memory_length
        self.first = 0  # the position of the oldest key kept

    @property
    def length(self) -> int:
        return self.first + (0 if self.valid is None else self.valid.shape[1])

    def window_start(self, position: int) -> int:
        """The first position that ``position`` sees: M before the start of its segment."""
        return max(0, position // self.segment_length * self.segment_length - self.memory_length)

    def forget_before_window(self) -> None:
        """Forget the keys older than the window of the next position: no later position sees them."""
        drop = self.window_start(self.length) - self.first
        if drop > 0:
            for kv in self.self_attn:
                kv.forget_oldest(drop)
            assert self.valid is not None  # positions to forget were fed: their validity is kept
            self.valid = self.valid[:, drop:]
            self.first += drop

    def window(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """(t, Tk) True where a key is in the window of a new query (the positions fed last); None when
        every new query's window holds every key kept (all in the segment of the first)."""
        if self.window_start(self.length - 1) == self.first:
            return None
        starts = (
            q_positions.div(self.segment_length, rounding_mode="floor") * self.segment_length - self.memory_length
        )  # (t,)
        return k_positions[None, :] >= starts[:, None]

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions (counted from the start; never before the last steps fed,
        so none of those was forgotten)."""
        super().truncate(length - self.first)


class MemoryDecoder(LayerStack):
    """Transformer-XL's decoder stack: DecoderLayers without cross-attention, each attending over its
    memory and the segment; ``memory_length`` M positions are remembered."""

    def __init__(self, layers: list[DecoderLayer], norm: nn.Module, memory_length: int) -> None:
        super().__init__(cast("list[nn.Module]", layers), norm)  # LayerStack only reads the list
        self.memory_length = memory_length

    def segment(self, y: Tensor, valid: Tensor, positions: Tensor, memory: SegmentMemory) -> Tensor:
        """y: (B, T, d_model) one segment at (T,) positions m .. m + T - 1, after the m positions the
        memory holds (at 0 .. m - 1); valid: (B, T). Updates ``memory`` -> (B, T, d_model)."""
        m = memory.length
        remembered = memory.states or [y[:, :0]] * len(self.layers)  # (B, m, d_model) per layer
        k_positions = torch.arange(m + y.shape[1], device=y.device)  # the memory's, then the segment's
        key_valid = torch.cat([valid[:, :0] if memory.valid is None else memory.valid, valid], dim=1)  # (B, m + T)
        mask = AttentionMask(key_valid=key_valid, causal=True)
        entered = []  # h^{n-1}_{tau+1}: what entered each layer
        for layer, states in zip(self.layers, remembered):
            entered.append(y)
            assert isinstance(layer, DecoderLayer)  # the stack is built of DecoderLayers
            kv = MemoryKV(*layer.memory_keys_values(states, k_positions[:m]))
            y = self.run_layer(layer, y, mask, (positions, k_positions), kv)
        memory.remember(entered, valid, self.memory_length)
        return self.norm(y)

    def steps(self, y: Tensor, valid: Tensor, positions: Tensor, cache: MemoryCache) -> Tensor:
        """y: (B, t, d_model) new steps at (t,) positions from ``cache.length`` on; valid: (B, t)
        -> (B, t, d_model). Each sees the cached keys of its window and the new steps up to itself."""
        cache.forget_before_window()
        valid = cache.extend(valid)  # (B, Tk): the keys kept, then these
        k_positions = torch.arange(cache.first, cache.length, device=y.device)  # (Tk,)
        mask = AttentionMask(key_valid=valid, causal=True, explicit=cache.window(positions, k_positions))
        for layer, kv in zip(self.layers, cache.self_attn):
            y = self.run_layer(layer, y, mask, (positions, k_positions), kv)
        return self.norm(y)


class TransformerXL(nn.Module):
    """Transformer-XL's language model: logits = Generator(MemoryDecoder(Embed(x))), reading a text in
    segments of ``segment_length`` tokens, each after a memory of ``memory_length`` positions.

    ``model(ids)`` reads ``ids`` as consecutive segments from an empty memory; ``model(ids,
    memory=m)`` reads them after what the :class:`SegmentMemory` ``m`` remembers and leaves the memory
    of what follows in ``m`` (training and evaluation over consecutive segments); ``model(ids,
    cache=model.new_cache())`` decodes new steps incrementally, with the same numbers."""

    static_cache = False  # its cache forgets the positions that leave every window (decode/search.py asks)

    def __init__(
        self, embed: Embeddings, decoder: MemoryDecoder, generator: nn.Linear, pad_id: int, segment_length: int
    ) -> None:
        super().__init__()
        self.embed, self.decoder, self.generator = embed, decoder, generator
        self.pad_id, self.segment_length = pad_id, segment_length

    @property
    def memory_length(self) -> int:
        return self.decoder.memory_length

    def forward(
        self,
        ids: Tensor,
        cache: MemoryCache | None = None,
        last_only: bool = False,
        memory: SegmentMemory | None = None,
    ) -> Tensor:
        """(B, T) ids -> (B, T, V) logits of each next token (``last_only``: (B, 1, V))."""
        y = self.states(ids, cache, memory)
        return self.generator(y[:, -1:] if last_only else y)

    def states(self, ids: Tensor, cache: MemoryCache | None = None, memory: SegmentMemory | None = None) -> Tensor:
        """(B, T) ids -> (B, T, d_model), the decoder's output: the new steps after a cache, or the
        segments after a memory (an empty one by default)."""
        if cache is not None:
            positions = self.embed.positions(cache.length, ids.shape[1], ids.device)
            return self.decoder.steps(self.embed(ids, positions), ids != self.pad_id, positions, cache)
        memory = SegmentMemory() if memory is None else memory
        return torch.cat([self.segment(part, memory) for part in torch.split(ids, self.segment_length, dim=1)], dim=1)

    def segment(self, ids: Tensor, memory: SegmentMemory) -> Tensor:
        """(B, T) ids of one segment -> (B, T, d_model); ``memory`` moves on past it."""
        positions = self.embed.positions(memory.length, ids.shape[1], ids.device)
        return self.decoder.segment(self.embed(ids, positions), ids != self.pad_id, positions, memory)

    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of the decoder's layers (train.strategy tp, nn/tensor_plan.py)."""
        return megatron(self, "decoder")

    def new_cache(self, capacity: int | None = None) -> MemoryCache:
        """A cache for incremental decoding; there is no static one (``capacity``): the window slides."""
        if capacity is not None:
            raise ValueError(
                "Transformer-XL's cache forgets the keys that leave its window, so it has no static "
                "cache of a fixed capacity; use kv_cache 'dynamic'"
            )
        return MemoryCache(len(self.decoder.layers), self.segment_length, self.memory_length)
