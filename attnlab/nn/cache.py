"""The incremental-decoding cache: keys and values kept between decoding steps.

Self-attention appends one step's keys/values at a time; cross-attention stores the projected
source once per sentence. ``reorder`` follows beam search: row i of the new cache is row
``index[i]`` of the old one."""

from __future__ import annotations

import torch
from torch import Tensor


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
        self.state = None

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

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add (B, H, t, Dh) new keys/values after the cached ones; return all of them."""
        end = self._length + k.shape[2]
        if self._k is None or end > self._k.shape[2]:
            capacity = max(end, 2 * (0 if self._k is None else self._k.shape[2]), 16)
            self._k, self._v = self._grown(self._k, k, capacity), self._grown(self._v, v, capacity)
        self._k[:, :, self._length:end] = k
        self._v[:, :, self._length:end] = v
        self._length = end
        return self.k, self.v

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
        on fresh memory; docs/performance.md)."""
        if self._k is not None:
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

    def extend(self, valid: Tensor) -> Tensor:
        """Record (B, t) validity of the new positions; return (B, T) validity of all of them."""
        self.valid = valid if self.valid is None else torch.cat([self.valid, valid], dim=1)
        return self.valid

    def reorder(self, index: Tensor, targets_only: bool = False) -> None:
        """Keep row ``index[i]`` of every cached tensor as row i (beam search). ``targets_only``:
        each row keeps a row of the same source (beams of one sentence), so the cross-attention
        keys/values and the source mask need no copy."""
        for kv in self.self_attn:
            kv.reorder(index)
        if self.valid is not None:
            self.valid = self.valid.index_select(0, index)
        if not targets_only:
            for kv in self.cross_attn:
                kv.reorder(index)
            if self.memory_valid is not None:
                self.memory_valid = self.memory_valid.index_select(0, index)
