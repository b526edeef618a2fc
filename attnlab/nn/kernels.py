"""The exact kernels of Attention itself, softmax(Q K^T / sqrt(d_k)) V: the interface every attention
backend implements with the reference ``math`` (:class:`AttentionBackend`, explicit scores), PyTorch's
fused ``sdpa`` and ``auto``, the default, which takes one of the two per call; ``BACKENDS``, the registry
every backend joins by naming itself. The blockwise, sparse and linear backends are nn/backends/; the
multi-head attention that calls these kernels is nn/attention.py.

Every backend's ``compute`` takes queries (B, H, Tq, D), keys and values (B, H, Tk, D), an
:class:`AttentionMask` (padding and causality as structure, so that no backend has to build a
(Tq, Tk) matrix), the queries' and keys' positions (Tq,), (Tk,), the attention-dropout probability,
an optional ``bias(q, q_pos, k_pos)`` of additive scores (relative / ALiBi positions) and the
self-attention cache, if any: the backend decides what the cache keeps, all keys and values (in a
growable or a static cache, nn/cache.py) or linear attention's state. Before that, its
``for_call`` says which backend computes the call (itself, or the one ``auto`` chooses) and refuses
what it cannot compute.
"""

from __future__ import annotations

from typing import Any, Callable

import torch.nn.functional as F
from torch import Tensor

from attnlab.errors import ConfigError
from attnlab.nn.cache import KVCache
from attnlab.nn.masks import AttentionMask
from attnlab.nn.scores import attention

BiasFn = Callable[[Tensor, Tensor, Tensor], "Tensor | None"]  # (q, q_pos, k_pos) -> (.., Tq, Tk) or None


def option_at_least(name: str, value: int, low: int) -> None:
    """A backend option's range check (nn imports no config helpers): one line naming the option."""
    if value < low:
        raise ConfigError(f"{name} must be >= {low} (got {value})")


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
    # its own options that it alone reads, as paths in a model config's ``backends`` (BackendOptions,
    # nn/backends/__init__.py): 'pattern.window', ...; the query block ``backends.block`` is shared
    fields: tuple[str, ...] = ()
    cross_attention: str | None = None  # the backend cross-attention takes instead (None: this one)
    devices = ("cpu", "cuda")
    static_cache = True  # decodes over a StaticKVCache: keys of a fixed capacity, the unwritten ones masked
    # computes without reading tensors on the host (no int(), .tolist(), data-dependent branch), so a
    # decoding step can be recorded as a CUDA graph. Not inherited: each backend vouches for its own code.
    captures = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that names itself registers itself: a new backend is one new file here."""
        super().__init_subclass__(**kwargs)
        cls.captures = cls.__dict__.get("captures", False)
        if "name" in cls.__dict__:
            if cls.name in BACKENDS:
                raise ValueError(f"attention backend '{cls.name}' is defined twice ({BACKENDS[cls.name]}, {cls})")
            BACKENDS[cls.name] = cls

    @classmethod
    def from_config(cls, cfg: Any) -> "AttentionBackend":
        """The backend with its own options, from a Transformer family's config (``cfg.backends``)."""
        return cls()

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttentionMask,
        q_pos: Tensor,
        k_pos: Tensor,
        dropout_p: float = 0.0,
        bias: BiasFn | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention in one call, for code that holds a backend (an attention module asks :meth:`for_call`
        and calls :meth:`compute` itself, a frame nearer the kernel): -> output (B, H, Tq, Dv) and,
        with ``need_weights``, the weights (B, H, Tq, Tk)."""
        return self.for_call(q, mask, dropout_p, need_weights).compute(
            q, k, v, mask, q_pos, k_pos, dropout_p, bias, cache
        )

    def for_call(self, q: Tensor, mask: AttentionMask, dropout_p: float, need_weights: bool) -> "AttentionBackend":
        """The backend that computes a call with queries ``q`` (B, H, Tq, D) under ``mask``, with this
        attention dropout, asked for the weights or not: this one, once it has checked that it can
        (``auto`` chooses 'math' or 'sdpa' here)."""
        if need_weights and not self.returns_weights:
            raise ValueError(f"attention backend '{self.name}' does not form the weights; use 'math' to get them")
        if mask.explicit is not None and not self.takes_explicit_mask:
            raise ValueError(f"attention backend '{self.name}' takes padding and causality, not an explicit mask")
        return self

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
        """softmax(q k^T / sqrt(D) + bias) v for q (B, H, Tq, D) and k, v (B, H, Tk', D) at (Tq,) and (Tk,)
        positions -> output (B, H, Tq, Dv) and the weights (B, H, Tq, Tk), or None from a backend that
        does not form them. A self-attention ``cache`` takes k and v (:func:`keys_so_far`)."""
        k, v = keys_so_far(k, v, q_pos, cache)
        b = bias(q, q_pos, k_pos) if bias is not None else None
        return attention(q, k, v, mask.dense(q_pos, k_pos), dropout_p, bias=b, need_weights=True)


def keys_so_far(k: Tensor, v: Tensor, positions: Tensor, cache: KVCache | None) -> tuple[Tensor, Tensor]:
    """The keys and values (B, H, Tk, D) that the queries attend over: the new ones (B, H, T, D) at
    (T,) ``positions``, or with a cache all that it holds once they have joined it (a static cache:
    its whole capacity, whose positions not yet written are in the queries' future, hidden by the
    causal mask)."""
    return (k, v) if cache is None else cache.append(k, v, positions)


BACKENDS[AttentionBackend.name] = AttentionBackend


class SDPABackend(AttentionBackend):
    """``torch.nn.functional.scaled_dot_product_attention``: PyTorch picks a flash, memory-efficient
    or C++ kernel. Padding and bias travel as one float mask; causality without padding or bias as
    ``is_causal``, which lets the fused kernels skip the masked half."""

    name = "sdpa"
    returns_weights = False
    captures = True

    @staticmethod
    def takes_no_mask_matrix(mask: AttentionMask, q: Tensor, k: Tensor) -> bool:
        """Whether the mask is all keys, or causality over as many queries as keys (``is_causal``):
        nothing (Tq, Tk) to build, and the flash kernel's O(T) memory."""
        return mask.key_valid is None and mask.explicit is None and (not mask.causal or q.shape[2] == k.shape[2])

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
        b = bias(q, q_pos, k_pos) if bias is not None else None
        if b is None and mask.causal and self.takes_no_mask_matrix(mask, q, k):  # no (Tq, Tk) mask to build
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True), None
        masks = mask.additive(q_pos, k_pos, q.dtype)  # built once for the layers of a stack
        if b is None and masks is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p), None
        attn_mask = b if masks is None else masks[0] if b is None else masks[0] + b
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        if masks is not None:  # a query with no allowed key: zeros, as in 'math' (not a uniform mix)
            out = out.masked_fill(masks[1], 0.0)
        return out, None


class AutoBackend(AttentionBackend):
    """Chooses per call. ``math`` when the weights are asked for (`inspect`, and Shaw's relative
    positions, whose value term is a sum over the probabilities) or when attention dropout runs on
    the CPU: PyTorch's fused CPU kernel has no dropout and falls back to a C++ copy of ``math``,
    while attnlab's own dropout keeps its draws, so a CPU run is the same under either backend.
    ``sdpa`` otherwise: inference everywhere, and training on a GPU, where the fused kernels drop
    probabilities themselves (with their own random draws). It declares all that ``math`` does,
    since it is ``math`` wherever ``sdpa`` cannot serve."""

    name = "auto"
    captures = True  # both choices capture, and the choice reads no tensor

    def __init__(self) -> None:
        self.fused, self.reference = SDPABackend(), AttentionBackend()

    def for_call(self, q: Tensor, mask: AttentionMask, dropout_p: float, need_weights: bool) -> AttentionBackend:
        by_math = need_weights or (dropout_p > 0.0 and q.device.type == "cpu")
        return (self.reference if by_math else self.fused).for_call(q, mask, dropout_p, need_weights)
