"""The interface every attention backend implements, and the reference backend ``math``.

Every backend takes queries (B, H, Tq, D), keys and values (B, H, Tk, D), an :class:`AttentionMask`
(padding and causality as structure, so that no backend has to build a (Tq, Tk) matrix), the
queries' and keys' positions (Tq,), (Tk,), the attention-dropout probability and an optional
``bias(q, q_pos, k_pos)`` of additive scores (relative / ALiBi positions). With a self-attention
cache, the backend decides what the cache keeps: all keys and values (in a growable or a static
cache, nn/cache.py), or linear attention's state.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from attnlab.nn.cache import KVCache
from attnlab.nn.dropout import dropout
from attnlab.nn.masks import AttentionMask
from attnlab.nn.scores import scaled_dot

BiasFn = Callable[[Tensor, Tensor, Tensor], "Tensor | None"]  # (q, q_pos, k_pos) -> (.., Tq, Tk) or None


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


BACKENDS: dict[str, type["AttentionBackend"]] = {}  # name -> class, filled as each backend is defined


class AttentionBackend:
    """The reference, ``math``: explicit scores, the only backend that can return the weights."""

    # What a backend can do, declared by each; config checks and the models' builders ask these.
    name = "math"
    returns_weights = True  # forms the (B, H, Tq, Tk) probabilities: need_weights, Shaw's value term
    takes_explicit_mask = True  # accepts an arbitrary boolean mask besides padding and causality
    exact = True  # computes softmax attention over every allowed key (what 'math' computes)
    score_bias = True  # adds a positional bias to the scores (relative_bias, ALiBi)
    attention_dropout = True  # can drop attention probabilities
    fields: tuple[str, ...] = ()  # the model-config fields it alone reads (attention_block is shared)
    cross_attention: str | None = None  # the backend cross-attention takes instead (None: this one)
    devices = ("cpu", "cuda")
    static_cache = True  # decodes over a StaticKVCache: keys of a fixed capacity, the unwritten ones masked
    # computes without reading tensors on the host (no int(), .tolist(), data-dependent branch), so a
    # decoding step can be recorded as a CUDA graph. Not inherited: each backend vouches for its own code.
    captures = True

    def __init_subclass__(cls, **kwargs) -> None:
        """A subclass that names itself registers itself: a new backend is one new file here."""
        super().__init_subclass__(**kwargs)
        cls.captures = cls.__dict__.get("captures", False)
        if "name" in cls.__dict__:
            if cls.name in BACKENDS:
                raise ValueError(f"attention backend '{cls.name}' is defined twice ({BACKENDS[cls.name]}, {cls})")
            BACKENDS[cls.name] = cls

    @classmethod
    def from_config(cls, cfg) -> "AttentionBackend":
        """The backend with its own fields of a Transformer family's config (attention_block, attention_window, ...)."""
        return cls()

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, q_pos: Tensor, k_pos: Tensor,
                 dropout_p: float = 0.0, bias: BiasFn | None = None, need_weights: bool = False,
                 cache: KVCache | None = None) -> tuple[Tensor, Tensor | None]:
        """-> output (B, H, Tq, Dv) and, with ``need_weights``, the weights (B, H, Tq, Tk)."""
        if need_weights and not self.returns_weights:
            raise ValueError(f"attention backend '{self.name}' does not form the weights; use 'math' to get them")
        if mask.explicit is not None and not self.takes_explicit_mask:
            raise ValueError(f"attention backend '{self.name}' takes padding and causality, not an explicit mask")
        if cache is None:
            return self.compute(q, k, v, mask, q_pos, k_pos, dropout_p, bias)
        return self.compute_cached(q, k, v, mask, q_pos, k_pos, dropout_p, bias, cache)

    def compute_cached(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, q_pos: Tensor, k_pos: Tensor,
                       dropout_p: float, bias: BiasFn | None, cache: KVCache) -> tuple[Tensor, Tensor | None]:
        """Self-attention of new steps after cached ones: by default, over all keys and values so far
        (with a static cache, over its whole capacity; the positions not yet written are in the
        queries' future, so the causal mask hides them)."""
        k, v = cache.append(k, v, q_pos)
        return self.compute(q, k, v, mask, q_pos, k_pos, dropout_p, bias)

    def compute(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, q_pos: Tensor, k_pos: Tensor,
                dropout_p: float, bias: BiasFn | None) -> tuple[Tensor, Tensor | None]:
        b = bias(q, q_pos, k_pos) if bias is not None else None
        return attention(q, k, v, mask.dense(q_pos, k_pos), dropout_p, bias=b, need_weights=True)


BACKENDS[AttentionBackend.name] = AttentionBackend
