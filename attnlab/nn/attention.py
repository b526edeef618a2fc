"""Scaled dot-product attention and multi-head attention.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.cache import KVCache
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.scores import scaled_dot


def attend(scores: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0) -> tuple[Tensor, Tensor]:
    """softmax over the keys of ``scores`` (..., Tq, Tk), masked keys excluded, then the weighted sum
    of ``v`` (..., Tk, Dv). Returns the output (..., Tq, Dv) and the weights as applied (after dropout).
    A query whose keys are all masked gets zero weights and a zero output, never NaN."""
    if mask is not None:
        # The most negative finite value, not -inf: a fully masked row stays finite through the
        # softmax (uniform), and is then zeroed by the second fill, in the forward and the backward.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1)
    if mask is not None:
        probs = probs.masked_fill(~mask, 0.0)
    if dropout_p > 0.0:
        probs = F.dropout(probs, dropout_p)
    return probs @ v, probs


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    temperature: float | None = None,
    bias: Tensor | None = None,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T / temperature + bias) v, with masked keys excluded.

    q: (..., Tq, Dk), k: (..., Tk, Dk), v: (..., Tk, Dv); mask: bool, True = may attend,
    broadcastable to (..., Tq, Tk); bias: additive, broadcastable likewise; temperature defaults
    to sqrt(Dk). Returns the output (..., Tq, Dv) and, when ``need_weights``, the weights
    (..., Tq, Tk) as applied to v (after dropout; in eval mode exactly the softmax).
    """
    scores = scaled_dot(q, k, temperature)  # (..., Tq, Tk)
    if bias is not None:
        scores = scores + bias
    out, probs = attend(scores, v, mask, dropout_p)
    return out, (probs if need_weights else None)


class MultiHeadAttention(nn.Module):
    """Multi-head self- or cross-attention, d_model = n_heads * d_head.

    Self-attention projects Q, K, V with one fused (d_model -> 3 d_model) matrix; cross-attention
    projects Q from the decoder and K, V with one fused (d_model -> 2 d_model) matrix from the
    encoder output ("memory"). With a :class:`KVCache`, self-attention appends the new steps' keys
    and values and attends over all of them; cross-attention projects the memory once and reuses it.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        cross: bool = False,
        positional: PositionalEncoding | None = None,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads, self.d_head, self.dropout_p, self.cross = n_heads, d_model // n_heads, dropout, cross
        if cross:
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.kv_proj = nn.Linear(d_model, 2 * d_model, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.positional = positional if positional is not None else PositionalEncoding()

    def _heads(self, x: Tensor, n: int) -> tuple[Tensor, ...]:
        """(B, T, n * d_model) -> n tensors (B, H, T, Dh)."""
        B, T, _ = x.shape
        return x.view(B, T, n, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        positions: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x: (B, Tq, d_model) queries (and keys/values for self-attention); memory: (B, Tk, d_model)
        keys/values for cross-attention; mask: bool, True = may attend, broadcastable to
        (B, H, Tq, Tk) over all keys (cached ones included); positions: (Tq,) query and (Tk,) key
        positions for relative schemes (default: the queries follow the cached steps, from 0).
        Returns (B, Tq, d_model) and, with ``need_weights``, per-head weights (B, H, Tq, Tk).
        """
        if positions is None:
            offset = len(cache) if cache is not None and not self.cross else 0
            q_pos = torch.arange(offset, offset + x.shape[1], device=x.device)
            k_pos = torch.arange(offset + x.shape[1], device=x.device)
        else:
            q_pos, k_pos = positions
        if self.cross:
            (q,) = self._heads(self.q_proj(x), 1)
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v
            else:
                k, v = self._heads(self.kv_proj(memory), 2)  # (B, H, Tk, Dh) each
                if cache is not None:
                    cache.store(k, v)
        else:
            q, k, v = self._heads(self.qkv_proj(x), 3)  # (B, H, Tq, Dh) each
            # the new keys sit at the new queries' positions; cached keys were rotated when they were new
            q, k = self.positional.rotate(q, q_pos), self.positional.rotate(k, q_pos)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, H, Tk, Dh), Tk = cached + Tq
        bias = self.positional.score_bias(q, q_pos, k_pos)
        out, probs = attention(
            q, k, v, mask,
            dropout_p=self.dropout_p if self.training else 0.0,
            bias=bias,
            need_weights=need_weights or self.positional.needs_probs,
        )  # (B, H, Tq, Dh)
        value_term = self.positional.value_term(probs, q_pos, k_pos)
        if value_term is not None:
            out = out + value_term
        B, H, Tq, Dh = out.shape
        out = self.out_proj(out.transpose(1, 2).reshape(B, Tq, H * Dh))  # (B, Tq, d_model)
        return out, (probs if need_weights else None)
