"""The incremental-decoding cache: keys and values kept between decoding steps.

Self-attention appends one step's keys/values at a time; cross-attention stores the projected
source once per sentence. ``reorder`` follows beam search: row i of the new cache is row
``index[i]`` of the old one.

Two kinds, with one interface: :class:`DecoderCache` grows as the decode goes (the default), and
:class:`StaticDecoderCache` is preallocated to a fixed number of positions, so that every step
has the same tensor shapes and addresses: the precondition for recording a step as a CUDA graph."""

from __future__ import annotations

from typing import Protocol, cast

import torch
from torch import Tensor


class CacheState(Protocol):
    """A backend's own decoding state in place of keys and values (linear attention's running sums)."""

    length: int  # positions it has taken in

    def reorder(self, index: Tensor) -> None: ...


class KVCache:
    """Keys and values that one attention module has seen, each (B, H, T, Dh); or, for a backend
    that needs less (linear attention), its own ``state`` with ``length`` and ``reorder``.

    Self-attention keys live in a buffer with room to grow (doubling when full), so that a step
    writes its keys in place instead of copying all earlier ones: decoding n tokens moves O(n)
    key/value data, not O(n^2). ``k`` and ``v`` are views of the filled part."""

    def __init__(self) -> None:
        self._k: Tensor | None = None  # (B, H, capacity, Dh)
        self._v: Tensor | None = None
        self._spare: tuple[Tensor, Tensor] | None = None  # what reorder writes into next
        self._length = 0
        self.state: CacheState | None = None

    @property
    def k(self) -> Tensor | None:
        return None if self._k is None else self._k[:, :, : self._length]

    @property
    def v(self) -> Tensor | None:
        return None if self._v is None else self._v[:, :, : self._length]

    def __len__(self) -> int:
        if self.state is not None:
            return self.state.length
        return self._length

    def append(self, k: Tensor, v: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Add (B, H, t, Dh) new keys/values after the cached ones; return all of them. (A static
        cache writes them at their (t,) ``positions``; this one holds positions 0 .. len - 1, so
        the new ones, which follow, go at its end whatever the argument.)"""
        end = self._length + k.shape[2]
        if self._k is None or end > self._k.shape[2]:
            capacity = max(end, 2 * (0 if self._k is None else self._k.shape[2]), 16)
            self._k, self._v = self._grown(self._k, k, capacity), self._grown(self._v, v, capacity)
        assert self._v is not None  # the keys' and values' buffers are made together
        self._k[:, :, self._length : end] = k
        self._v[:, :, self._length : end] = v
        self._length = end
        return cast(Tensor, self.k), cast(Tensor, self.v)  # filled just above: never None here

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (speculative decoding's rejected tokens)."""
        if self.state is not None:
            raise ValueError(
                "this attention backend keeps a running state, not keys per position; it cannot take "
                "back positions (speculative decoding needs one that caches keys and values)"
            )
        self._length = min(self._length, length)

    def forget_oldest(self, n: int) -> None:
        """Forget the ``n`` oldest positions, moving the rest to the front of the buffers (a window that
        slides: Transformer-XL's memory, nn/memory.py)."""
        kept = self._length - n
        for buffer in (self._k, self._v):
            assert buffer is not None  # a window that slides has keys to move
            buffer[:, :, :kept] = buffer[:, :, n : self._length].clone()
        self._length = kept

    def _grown(self, old: Tensor | None, new: Tensor, capacity: int) -> Tensor:
        buffer = new.new_empty(*new.shape[:2], capacity, new.shape[3])
        if old is not None:
            buffer[:, :, : self._length] = old[:, :, : self._length]
        return buffer

    def store(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keep keys/values that do not change between steps (cross-attention over the source),
        made contiguous once: the heads are strided views of one projection, and every step's
        products would otherwise copy them again."""
        self._k, self._v, self._length = k.contiguous(), v.contiguous(), k.shape[2]
        return self._k, self._v

    def reorder(self, index: Tensor) -> None:
        """Keep row ``index[i]`` as row i. Only the filled part is copied, into a second pair of
        buffers kept for the purpose (the pairs swap at every reorder): beam search reorders at
        every step, and selecting into new memory each time cost ten times as much (page faults
        on fresh memory; docs/performance/decoding.md)."""
        if self._k is not None:
            assert self._v is not None  # the keys' and values' buffers are made together
            shape = (len(index), *self._k.shape[1:])
            if self._spare is None or self._spare[0].shape != shape:
                self._spare = (self._k.new_empty(shape), self._v.new_empty(shape))
            spare_k, spare_v = self._spare
            filled = slice(0, self._length)
            torch.index_select(self._k[:, :, filled], 0, index, out=spare_k[:, :, filled])
            torch.index_select(self._v[:, :, filled], 0, index, out=spare_v[:, :, filled])
            self._spare = (self._k, self._v)
            self._k, self._v = spare_k, spare_v
        if self.state is not None:
            self.state.reorder(index)


class DecoderCache:
    """Incremental state of a decoder stack: per layer a self- and a cross-attention KVCache;
    which of the target positions seen so far are real tokens (to mask padding in later steps);
    and which source positions are real, kept with the cross-attention keys they belong to."""

    def __init__(self, n_layers: int) -> None:
        self.self_attn = [KVCache() for _ in range(n_layers)]
        self.cross_attn = [KVCache() for _ in range(n_layers)]
        self.valid: Tensor | None = None  # (B, T) True for real target tokens
        self.memory_valid: Tensor | None = None  # (B, S) True for real source tokens

    @property
    def length(self) -> int:
        """Number of target positions already decoded."""
        return 0 if self.valid is None else self.valid.shape[1]

    @property
    def offset(self) -> int | Tensor:
        """Where the next steps start: the models' embeddings number the new positions from here."""
        return self.length

    def extend(self, valid: Tensor) -> Tensor:
        """Record (B, t) validity of the new positions; return (B, T) validity of all of them."""
        self.valid = valid if self.valid is None else torch.cat([self.valid, valid], dim=1)
        return self.valid

    def source_valid(self, memory_valid: Tensor) -> Tensor:
        """Keep the first step's (B, S) source mask with the cross-attention keys it belongs to (and
        reordered with them); return the kept one."""
        if self.memory_valid is None:
            self.memory_valid = memory_valid
        return self.memory_valid

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` target positions, forgetting the rest (rejected draft tokens)."""
        for kv in self.self_attn:
            kv.truncate(length)
        if self.valid is not None:
            self.valid = self.valid[:, :length]

    def reorder(self, index: Tensor, targets_only: bool = False) -> None:
        """Keep row ``index[i]`` of every cached tensor as row i (beam search). ``targets_only``:
        each row keeps a row of the same source (beams of one sentence), so the cross-attention
        keys/values and the source mask need no copy."""
        for kv in self.self_attn:
            kv.reorder(index)
        self.valid = self._select(self.valid, index)
        if not targets_only:
            for kv in self.cross_attn:
                kv.reorder(index)
            self.memory_valid = self._select(self.memory_valid, index)

    @staticmethod
    def _select(rows: Tensor | None, index: Tensor) -> Tensor | None:
        return None if rows is None else rows.index_select(0, index)


class StaticKVCache:
    """The keys and values of one attention module in buffers allocated once, at the first write.

    Self-attention: (B, H, capacity, Dh) buffers; each step writes its keys at its positions in
    place (an index_copy_ by a position tensor, not a slice by a Python int that changes every
    step) and attends over the whole capacity, the positions not yet written hidden by the causal
    mask. They hold zeros until written: a masked weight is 0, and 0 * NaN of uninitialised memory
    would not be. Cross-attention: the projected source, stored once. ``reorder`` copies into the
    same buffers. So every step reads and writes the same tensors at the same addresses."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.k: Tensor | None = None  # (B, H, capacity, Dh), or (B, H, S, Dh) for cross-attention
        self.v: Tensor | None = None

    def append(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Write (B, H, t, Dh) keys/values at (t,) ``positions``; return the whole buffers."""
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:2], self.capacity, k.shape[3])
            self.v = v.new_zeros(*v.shape[:2], self.capacity, v.shape[3])
        assert self.v is not None  # the keys' and values' buffers are made together
        self.k.index_copy_(2, positions, k)
        self.v.index_copy_(2, positions, v)
        return self.k, self.v

    def store(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keep keys/values that do not change between steps (cross-attention over the source)."""
        self.k, self.v = k.contiguous(), v.contiguous()
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Keep row ``index[i]`` as row i, in place (``index`` has one entry per row)."""
        self.k, self.v = _select_in_place(self.k, index), _select_in_place(self.v, index)


def _select_in_place(rows: Tensor | None, index: Tensor) -> Tensor | None:
    """rows[i] = rows[index[i]] for every row, into the same memory."""
    return None if rows is None else rows.copy_(rows.index_select(0, index))


class StaticDecoderCache(DecoderCache):
    """A DecoderCache of fixed shapes: room for ``capacity`` target positions (the most a decode
    will feed, known up front from its length limits), a (B, capacity) validity buffer, and the
    number of positions filled as a (1,) tensor on the device, advanced in place. No step changes a
    Python attribute or a tensor's address, so a recorded CUDA graph of a step replays correctly."""

    def __init__(self, n_layers: int, capacity: int, device: torch.device | str) -> None:
        # a StaticKVCache stands in for a KVCache (append, store, reorder, k and v): a backend that keeps a
        # running state never decodes over one (its static_cache is False), and truncate is this class's own
        self.self_attn = cast("list[KVCache]", [StaticKVCache(capacity) for _ in range(n_layers)])
        # capacity unused in cross-attention: the source is stored whole
        self.cross_attn = cast("list[KVCache]", [StaticKVCache(capacity) for _ in range(n_layers)])
        self.capacity = capacity
        self.filled = torch.zeros(1, dtype=torch.long, device=device)  # (1,) positions written so far
        self.valid: Tensor | None = None  # (B, capacity) True for real target tokens
        self.memory_valid: Tensor | None = None  # (B, S) True for real source tokens

    @property
    def length(self) -> int:
        raise TypeError("a static cache keeps its length on the device (.filled); reading it would wait for the device")

    @property
    def offset(self) -> Tensor:
        return self.filled

    def extend(self, valid: Tensor) -> Tensor:
        """Write (B, t) validity at the next t positions and advance; return the (B, capacity) buffer."""
        if self.valid is None:
            self.valid = valid.new_zeros(valid.shape[0], self.capacity)
        positions = self.filled + torch.arange(valid.shape[1], device=valid.device)  # (t,)
        self.valid.index_copy_(1, positions, valid)
        self.filled += valid.shape[1]
        return self.valid

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions: later ones are rewritten before any query reads them
        (the causal mask hides a position until its step writes it)."""
        self.filled.fill_(length)

    def source_valid(self, memory_valid: Tensor) -> Tensor:
        """A copy of the first step's source mask, so that reordering it in place touches nothing else."""
        if self.memory_valid is None:
            self.memory_valid = memory_valid.clone()
        return self.memory_valid

    @staticmethod
    def _select(rows: Tensor | None, index: Tensor) -> Tensor | None:
        """In place: ``index`` has one entry per row, since the batch of a static cache never shrinks."""
        return _select_in_place(rows, index)
