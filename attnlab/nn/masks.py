"""Attention masks. One convention everywhere: boolean, True = may attend, broadcastable to
(B, H, Tq, Tk). Padding is known from the token ids, causality from the positions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import torch
from torch import Tensor

Built = TypeVar("Built")  # what AttentionMask._remembered builds and keeps


def padding_mask(valid: Tensor) -> Tensor:
    """(B, Tk) True for real tokens -> (B, 1, 1, Tk): every query may attend to every real key."""
    return valid[:, None, None, :]


def causal_mask(q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """(Tq,), (Tk,) positions -> (Tq, Tk): a query sees keys at its own position or earlier.

    Written over positions rather than a square lower triangle so that it also holds when the
    queries are the newest steps of an incremental decode (Tq < Tk)."""
    return k_positions[None, :] <= q_positions[:, None]


@dataclass(frozen=True)
class AttentionMask:
    """Which keys each query may see, kept as structure so that a backend need never build (Tq, Tk):

    key_valid: (B, Tk) True for real keys (padding excluded), or None;
    causal:    a query sees keys at its own position or earlier (from the positions);
    explicit:  any other boolean mask broadcastable to (B, H, Tq, Tk), for the backends that take
               one ('math', 'sdpa'); None for the usual padding-and-causality cases.
    """

    key_valid: Tensor | None = None
    causal: bool = False
    explicit: Tensor | None = None
    # kind ('dense' or a dtype) -> (q_pos, k_pos, what build gave: a mask, or additive's pair)
    _last: dict[str | torch.dtype, tuple[Tensor, Tensor, Any]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def dense(self, q_pos: Tensor, k_pos: Tensor, keys: slice | Tensor | None = None) -> Tensor | None:
        """Boolean (B or 1, 1, Tq, Tk) for queries and keys at these positions, None if all may
        attend. ``keys`` picks the keys (a slice or indices into Tk) when ``k_pos`` is a subset.
        The layers of a stack share one mask and one pair of position tensors, so the mask over all
        keys is built by the first layer and reused by the others."""
        if keys is None:
            return self._remembered("dense", q_pos, k_pos, lambda: self._build(q_pos, k_pos, None))
        return self._build(q_pos, k_pos, keys)

    def additive(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor] | None:
        """:meth:`dense` for a kernel that adds its mask to the scores: (B or 1, 1, Tq, Tk) of 0 where
        a query may attend and half the dtype's most negative value where not (so that adding a
        bias cannot overflow to -inf and no row becomes NaN), with the (B or 1, 1, Tq, 1) queries
        that may attend to no key at all (their output must be zeros); None if all may attend.
        Built by the first layer of a stack and reused by the others, like :meth:`dense`."""

        def build() -> tuple[Tensor, Tensor] | None:
            allowed = self.dense(q_pos, k_pos)
            if allowed is None:
                return None
            return (
                torch.zeros((), dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min / 2),
                ~allowed.any(-1, keepdim=True),
            )

        return self._remembered(dtype, q_pos, k_pos, build)

    def _remembered(self, kind: str | torch.dtype, q_pos: Tensor, k_pos: Tensor, build: Callable[[], Built]) -> Built:
        """``build()``, or what it gave last for ``kind`` if that was for these same position tensors
        (the layers of a stack share them)."""
        last = self._last.get(kind)
        if last is None or last[0] is not q_pos or last[1] is not k_pos:
            last = self._last[kind] = (q_pos, k_pos, build())
        return last[2]

    def _build(self, q_pos: Tensor, k_pos: Tensor, keys: slice | Tensor | None) -> Tensor | None:
        mask = causal_mask(q_pos, k_pos)[None, None] if self.causal else None
        if self.key_valid is not None:
            valid = self.key_valid if keys is None else self.key_valid[:, keys]
            mask = padding_mask(valid) if mask is None else mask & padding_mask(valid)
        if self.explicit is not None:
            mask = self.explicit if mask is None else mask & self.explicit
        return mask
