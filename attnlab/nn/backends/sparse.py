"""``sparse`` and ``local``: attention restricted to a pattern of keys (a sliding window, strided
summaries, global tokens, random blocks), computed block by block over the candidate keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnlab.nn.cache import KVCache
from attnlab.nn.kernels import AttentionBackend, BiasFn, keys_so_far, option_at_least
from attnlab.nn.masks import AttentionMask
from attnlab.nn.scores import attention


@dataclass(frozen=True)
class PatternOptions:
    """``sparse``'s and ``local``'s options (``model.backends.pattern``), a :class:`SparsePattern`'s sizes:
    the ``window`` (local reads only it), the ``stride`` of the "fixed" summaries (0: none), the
    ``n_global`` tokens and the ``n_random`` key blocks per query block."""

    window: int = 128
    stride: int = 0
    n_global: int = 0
    n_random: int = 0

    def __post_init__(self) -> None:
        for name in ("window", "stride", "n_global", "n_random"):
            option_at_least(name, getattr(self, name), 0)


@dataclass(frozen=True)
class SparsePattern:
    """Which keys a query may see, as a union of patterns (a causal mask and padding come on top):

    - window:  ``|i - j| <= window`` (Longformer's sliding window; ``local`` is this alone);
    - stride:  the last position of every ``stride`` keys, j mod stride = stride - 1 (the "fixed"
               summaries of Child et al. 2019); 0 turns it off;
    - n_global: the first ``n_global`` positions see all keys and are seen by all queries;
    - n_random: each block of ``block`` queries also sees ``n_random`` key blocks drawn with ``seed``
               (BigBird), the same draw every call.
    """

    window: int
    stride: int = 0
    n_global: int = 0
    n_random: int = 0
    block: int = 64
    seed: int = 0

    def random_blocks(self, query_block: int, n_keys: int, causal: bool) -> Tensor:
        """The key blocks that query block ``query_block`` sees at random: (<= n_random,) indices,
        drawn from the blocks of ``n_keys`` keys, or with a causal mask from blocks 0..query_block
        (so that a decoding step draws what the full pass drew)."""
        n_blocks = query_block + 1 if causal else -(-n_keys // self.block)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + query_block)
        return torch.randperm(n_blocks, generator=g)[: self.n_random]

    def _random(self, q_pos: Tensor, k_pos: Tensor, n_keys: int, causal: bool) -> Tensor:
        """(Tq, Tk) bool: the keys each query sees through its block's random key blocks."""
        chosen = torch.zeros(q_pos.numel(), k_pos.numel(), dtype=torch.bool, device=k_pos.device)
        for qb in torch.unique(q_pos // self.block).tolist():
            blocks = self.random_blocks(qb, n_keys, causal).to(k_pos.device)
            chosen |= (q_pos // self.block == qb)[:, None] & torch.isin(k_pos // self.block, blocks)[None, :]
        return chosen

    def allowed(self, q_pos: Tensor, k_pos: Tensor, n_keys: int, causal: bool = False) -> Tensor:
        """(Tq,), (Tk,) positions of queries and (some of) ``n_keys`` keys -> (Tq, Tk) bool: the
        pattern as an explicit mask (causality itself is the AttentionMask's, not applied here)."""
        allowed = (k_pos[None, :] - q_pos[:, None]).abs() <= self.window
        if self.stride:
            allowed |= (k_pos % self.stride == self.stride - 1)[None, :]
        if self.n_global:
            allowed |= (k_pos < self.n_global)[None, :] | (q_pos < self.n_global)[:, None]
        if self.n_random:
            allowed |= self._random(q_pos, k_pos, n_keys, causal)
        return allowed

    def candidate_keys(self, q_pos: Tensor, k_pos: Tensor, causal: bool = False) -> Tensor:
        """Indices into the keys that cover every key one block of queries may see: (n,) ascending."""
        if self.n_global and bool((q_pos < self.n_global).any()):
            return torch.arange(k_pos.numel(), device=k_pos.device)  # a global query sees everything
        keep = (k_pos >= int(q_pos.min()) - self.window) & (k_pos <= int(q_pos.max()) + self.window)
        if self.stride:
            keep |= k_pos % self.stride == self.stride - 1
        if self.n_global:
            keep |= k_pos < self.n_global
        if self.n_random:
            keep |= self._random(q_pos, k_pos, k_pos.numel(), causal).any(0)
        return keep.nonzero().squeeze(1)


class SparseBackend(AttentionBackend):
    """Attention restricted to a :class:`SparsePattern`, computed block by block: each block of
    ``pattern.block`` queries gathers only its candidate keys, so the cost is O(T x keys per query),
    and the result equals ``math`` under ``pattern.allowed`` as an explicit mask."""

    name = "sparse"
    returns_weights = False
    takes_explicit_mask = False
    exact = False  # attends to the pattern's keys only
    fields: tuple[str, ...] = ("pattern.window", "pattern.stride", "pattern.n_global", "pattern.n_random")
    cross_attention = "chunked"  # a pattern over positions of one sequence; target over source is exact

    @classmethod
    def from_config(cls, cfg: Any) -> "SparseBackend":
        pattern = cfg.backends.pattern
        return cls(
            SparsePattern(pattern.window, pattern.stride, pattern.n_global, pattern.n_random, cfg.backends.block)
        )

    def __init__(self, pattern: SparsePattern) -> None:
        self.pattern = pattern

    def compute(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttentionMask,
        q_pos: Tensor,
        k_pos: Tensor,
        dropout_p: float,
        bias: BiasFn | None,
        cache: KVCache | None,
    ) -> tuple[Tensor, Tensor | None]:
        k, v = keys_so_far(k, v, q_pos, cache)
        block = self.pattern.block
        if block <= 0:
            raise ValueError("sparse attention needs a block size of at least 1")
        outputs = []
        for start in range(0, q.shape[2], block):
            rows = slice(start, start + block)
            qp = q_pos[rows]
            keys = self.pattern.candidate_keys(qp, k_pos, mask.causal)  # (n,)
            kp = k_pos[keys]
            allowed = self.pattern.allowed(qp, kp, k_pos.numel(), mask.causal)  # (bq, n)
            structural = mask.dense(qp, kp, keys)
            allowed = allowed if structural is None else structural & allowed
            b = bias(q[:, :, rows], qp, kp) if bias is not None else None
            out, _ = attention(
                q[:, :, rows], k.index_select(2, keys), v.index_select(2, keys), allowed, dropout_p, bias=b
            )
            outputs.append(out)
        return torch.cat(outputs, dim=2), None


class LocalBackend(SparseBackend):
    """A sliding window of +-``window`` keys (with a causal mask: the ``window`` before and the
    query itself): the sparse pattern with nothing but the window, in blocks of ``block`` queries."""

    name = "local"
    fields = ("pattern.window",)

    def __init__(self, window: int, block: int = 64) -> None:
        super().__init__(SparsePattern(window=window, block=block))

    @classmethod
    def from_config(cls, cfg: Any) -> "LocalBackend":
        return cls(cfg.backends.pattern.window, cfg.backends.block)
