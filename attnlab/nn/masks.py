"""Attention masks. One convention everywhere: boolean, True = may attend, broadcastable to
(B, H, Tq, Tk). Padding is known from the token ids, causality from the positions."""

from __future__ import annotations

from torch import Tensor


def padding_mask(valid: Tensor) -> Tensor:
    """(B, Tk) True for real tokens -> (B, 1, 1, Tk): every query may attend to every real key."""
    return valid[:, None, None, :]


def causal_mask(q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """(Tq,), (Tk,) positions -> (Tq, Tk): a query sees keys at its own position or earlier.

    Written over positions rather than a square lower triangle so that it also holds when the
    queries are the newest steps of an incremental decode (Tq < Tk)."""
    return k_positions[None, :] <= q_positions[:, None]
