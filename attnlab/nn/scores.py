"""Alignment score functions: how well a query (a decoder state s_t) matches each key (an encoder
state h_i); the scale of the Transformer's scores; and the masked softmax and weighted sum that
turn scores into an attention output. Every attention in attnlab takes its scores from here.

==============  =================================================  ============================
name            score(s_t, h_i)                                    source
==============  =================================================  ============================
dot             s_t . h_i                                          Luong et al. 2015
scaled_dot      s_t . h_i / sqrt(n)                                Vaswani et al. 2017
general         s_t^T W_a h_i                                      Luong et al. 2015
additive        v_a^T tanh(W_s s_t + W_h h_i)   (= W_a [s_t; h_i])  Bahdanau et al. 2015
cosine          cos(s_t, h_i)                                      Graves et al. 2014
location        (W_a s_t)_i: depends on the target state only      Luong et al. 2015
==============  =================================================  ============================

Each module maps queries (B, Tq, Dq) and keys (B, S, Dk) to scores (B, Tq, S); the softmax and the
weighted sum are ``attend`` below. A score is ``compare(q, keys(k))``: ``keys`` is the
part that depends on the source alone (W_h h_i for additive, W_a h_i for general, unit vectors for
cosine), which a recurrent decoder computes once per sentence instead of once per step, as
Bahdanau et al. (2015, appendix A.1.2) do with U_a h_j.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.dropout import dropout


def scaled_dot(q: Tensor, k: Tensor, temperature: float | None = None) -> Tensor:
    """q k^T / temperature, temperature = sqrt(Dk) by default: (..., Tq, D), (..., Tk, D) -> (..., Tq, Tk)."""
    temperature = math.sqrt(q.shape[-1]) if temperature is None else temperature
    return q @ k.transpose(-2, -1) / temperature


def attend(scores: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0) -> tuple[Tensor, Tensor]:
    """softmax over the keys of ``scores`` (..., Tq, Tk), masked keys excluded, then the weighted sum
    of ``v`` (..., Tk, Dv). Returns the output (..., Tq, Dv) and the weights as applied (after dropout).
    A query whose keys are all masked gets zero weights and a zero output, never NaN."""
    if mask is not None:
        # The most negative finite value, not -inf: a fully masked row stays finite through the
        # softmax (uniform), and is then zeroed by the second fill, in the forward and the backward.
        masked = ~mask
        scores = scores.masked_fill(masked, torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1)
    if mask is not None:
        probs = probs.masked_fill(masked, 0.0)
    if dropout_p > 0.0:
        probs = dropout(probs, dropout_p)
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


class PaperScale(nn.Identity):
    """Scores q . k / sqrt(d_k), the paper's (the backends divide by sqrt(d_k)): queries unchanged."""

    def __init__(self, d_head: int) -> None:
        super().__init__()


class NoScale(nn.Module):
    """Scores q . k, unscaled (the ablation): queries times sqrt(d_k), which the backends divide away."""

    def __init__(self, d_head: int) -> None:
        super().__init__()
        self.factor = d_head**0.5

    def forward(self, q: Tensor) -> Tensor:
        return q * self.factor


class LearnedScale(nn.Module):
    """Scores s q . k with a learned s per attention module, from s = 1 / sqrt(d_k)."""

    def __init__(self, d_head: int) -> None:
        super().__init__()
        self.sqrt_d = d_head**0.5
        self.scale = nn.Parameter(torch.tensor(1 / self.sqrt_d))

    def forward(self, q: Tensor) -> Tensor:
        return q * (self.scale * self.sqrt_d).to(q.dtype)


class AlignmentScore(nn.Module):
    """score(queries (B, Tq, Dq), keys (B, S, Dk)) -> (B, Tq, S), as compare(q, keys(k))."""

    def __init__(self, d_query: int, d_key: int, d_attn: int | None = None, max_len: int | None = None) -> None:
        super().__init__()

    def keys(self, k: Tensor) -> Tensor:
        """(B, S, Dk) -> what ``compare`` needs of the keys; the keys themselves by default."""
        return k

    def compare(self, q: Tensor, keys: Tensor) -> Tensor:
        """(B, Tq, Dq) queries against ``keys(k)`` -> (B, Tq, S) scores."""
        raise NotImplementedError

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return self.compare(q, self.keys(k))


class DotScore(AlignmentScore):
    def compare(self, q: Tensor, keys: Tensor) -> Tensor:
        return q @ keys.transpose(-2, -1)


class ScaledDotScore(AlignmentScore):
    def compare(self, q: Tensor, keys: Tensor) -> Tensor:
        return scaled_dot(q, keys)


class GeneralScore(AlignmentScore):
    def __init__(self, d_query: int, d_key: int, d_attn: int | None = None, max_len: int | None = None) -> None:
        super().__init__(d_query, d_key)
        self.W_a = nn.Linear(d_key, d_query, bias=False)  # h_i -> W_a h_i in the query space

    def keys(self, k: Tensor) -> Tensor:
        return self.W_a(k)  # (B, S, Dq)

    def compare(self, q: Tensor, keys: Tensor) -> Tensor:
        return q @ keys.transpose(-2, -1)


class AdditiveScore(AlignmentScore):
    def __init__(self, d_query: int, d_key: int, d_attn: int | None = None, max_len: int | None = None) -> None:
        super().__init__(d_query, d_key)
        d_attn = d_attn or d_query
        self.W_s = nn.Linear(d_query, d_attn, bias=False)
        self.W_h = nn.Linear(d_key, d_attn, bias=False)
        self.v_a = nn.Linear(d_attn, 1, bias=False)

    def keys(self, k: Tensor) -> Tensor:
        return self.W_h(k)  # (B, S, Da)

    def compare(self, q: Tensor, keys: Tensor) -> Tensor:
        energy = torch.tanh(self.W_s(q)[:, :, None, :] + keys[:, None, :, :])  # (B, Tq, S, Da)
        return self.v_a(energy).squeeze(-1)  # (B, Tq, S)


class CosineScore(AlignmentScore):
    def keys(self, k: Tensor) -> Tensor:
        return F.normalize(k, dim=-1)

    def compare(self, q: Tensor, keys: Tensor) -> Tensor:
        return F.normalize(q, dim=-1) @ keys.transpose(-2, -1)


class LocationScore(AlignmentScore):
    """Scores for source positions 0..max_len-1 from the query alone; keys only set how many count."""

    def __init__(self, d_query: int, d_key: int, d_attn: int | None = None, max_len: int | None = None) -> None:
        super().__init__(d_query, d_key)
        if max_len is None:
            raise ValueError("location scores need max_len (one weight row per source position)")
        self.W_a = nn.Linear(d_query, max_len)

    def compare(self, q: Tensor, keys: Tensor) -> Tensor:
        S = keys.shape[1]
        if S > self.W_a.out_features:
            raise ValueError(f"source of {S} positions; location scores cover {self.W_a.out_features}")
        return self.W_a(q)[..., :S]
