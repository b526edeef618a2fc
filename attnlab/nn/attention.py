"""Multi-head attention, from the heads down to the kernel: :class:`SelfAttention` and
:class:`CrossAttention` over the core they share (:class:`MultiHeadAttention`),

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

and the exact kernels of Attention itself, softmax(Q K^T / sqrt(d_k)) V: the interface every
backend implements with the reference ``math`` (:class:`AttentionBackend`, explicit scores),
PyTorch's fused ``sdpa`` and ``auto``, the default, which takes one of the two per call. The
blockwise, sparse and linear backends are nn/backends/. The scale of the scores is the paper's
unless an ablation replaces it (nn/scores.py: ``NoScale``, ``LearnedScale``), by rescaling the
queries before the backend divides by sqrt(d_k).

Every backend's ``compute`` takes queries (B, H, Tq, D), keys and values (B, H, Tk, D), an
:class:`AttentionMask` (padding and causality as structure, so that no backend has to build a
(Tq, Tk) matrix), the queries' and keys' positions (Tq,), (Tk,), the attention-dropout probability,
an optional ``bias(q, q_pos, k_pos)`` of additive scores (relative / ALiBi positions) and the
self-attention cache, if any: the backend decides what the cache keeps, all keys and values (in a
growable or a static cache, nn/cache.py) or linear attention's state. Before that, its
``for_call`` says which backend computes the call (itself, or the one ``auto`` chooses) and refuses
what it cannot compute. The attention modules call both themselves, so that a GPT block is three
calls from PyTorch's kernel: DecoderLayer -> ResidualConnection -> SelfAttention -> SDPABackend.compute.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.nn.cache import KVCache
from attnlab.nn.masks import AttentionMask
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.scores import PaperScale, attention

BiasFn = Callable[[Tensor, Tensor, Tensor], "Tensor | None"]  # (q, q_pos, k_pos) -> (.., Tq, Tk) or None


class MultiHeadAttention(nn.Module):
    """What self- and cross-attention share, MultiHead(Q, K, V) with d_model = n_heads * d_head. A
    subclass's forward projects its inputs to per-head queries, keys and values (:class:`SelfAttention`
    with one fused W^Q|W^K|W^V, :class:`CrossAttention` with W^Q and a fused W^K|W^V), has its
    backend's :meth:`~AttentionBackend.compute` attend with them (the backend this call takes:
    :meth:`kernel`) and merges the heads through W^O (:meth:`merge_heads`). The forward calls the
    kernel itself, so that PyTorch's fused attention is one call away from it. Code that treats
    every attention module alike (capture, head gates and pruning, initialisation) asks for this class."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float,
        bias: bool,
        positional: PositionalEncoding | None,
        backend: AttentionBackend | None,
        scale: nn.Module | None,
        **projections: nn.Linear,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads, self.d_head, self.dropout_p = n_heads, d_model // n_heads, dropout
        for name, projection in projections.items():  # registered first: the order init_weights draws in
            setattr(self, name, projection)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O
        self.positional = positional if positional is not None else PositionalEncoding()
        self.backend = backend if backend is not None else AttentionBackend()
        self.scale = scale if scale is not None else PaperScale(self.d_head)  # what multiplies q . k
        self.head_gate: Tensor | None = None  # (H,) multiplies each head's output (head importance, masking)

    def split_heads(self, x: Tensor, n: int) -> tuple[Tensor, ...]:
        """(B, T, n * d_model) -> n tensors (B, H, T, Dh), views of ``x`` (their gradients are
        written into one (B, T, n * d_model) tensor, with no stack and copy)."""
        B, T, _ = x.shape
        return tuple(part.transpose(1, 2) for part in x.view(B, T, n, self.n_heads, self.d_head).unbind(2))

    def kernel(self, q: Tensor, mask: AttentionMask) -> AttentionBackend:
        """The backend that attends with queries ``q`` under ``mask`` (``auto``: 'math' or 'sdpa'),
        asked for the weights where Shaw's value term needs them."""
        return self.backend.for_call(q, mask, self.attention_dropout, self.positional.needs_probs)

    @property
    def attention_dropout(self) -> float:
        """The probability of dropping an attention weight: the configured one in training, 0 in evaluation."""
        return self.dropout_p if self.training else 0.0

    @property
    def score_bias(self) -> BiasFn | None:
        """The positions' additive scores (relative, ALiBi) for the backend to add, or None."""
        return self.positional.score_bias if self.positional.biases_scores else None

    def merge_heads(self, heads: Tensor, probs: Tensor | None, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Concat_i(head_i (+ Shaw's value term)) W^O: heads (B, H, Tq, Dh) with the weights (B, H, Tq, Tk)
        that formed them (None from a backend that does not form them) -> (B, Tq, d_model)."""
        value_term = self.positional.value_term(probs, q_pos, k_pos)  # sum_j a_ij r^V_ij (Shaw et al.), or None
        if value_term is not None:
            heads = heads + value_term
        if self.head_gate is not None:
            heads = heads * self.head_gate.to(heads.dtype)[None, :, None, None]
        B, H, Tq, Dh = heads.shape
        return self.out_proj(heads.transpose(1, 2).reshape(B, Tq, H * Dh))  # Concat(heads) W^O: (B, Tq, d_model)

    def prune_heads(self, heads: list[int]) -> None:
        """Remove these heads from the weights (Michel et al. 2019): their rows of the Q, K and V
        projections, their columns of the output projection, and their share of per-head positional
        parameters. The layer then computes exactly what it computed with those heads gated to zero."""
        keep = [h for h in range(self.n_heads) if h not in set(heads)]
        if not keep:
            raise ValueError("pruning would remove every head of a layer; keep at least one")
        per_head = torch.arange(self.d_head)
        inner = torch.cat([h * self.d_head + per_head for h in keep])  # columns of the kept heads
        self.prune_projections(inner, self.n_heads * self.d_head)
        self.out_proj = _sliced(self.out_proj, inputs=inner)
        self.positional.keep_heads(torch.tensor(keep))
        if self.head_gate is not None:
            self.head_gate = self.head_gate[keep]
        self.n_heads = len(keep)

    def prune_projections(self, inner: Tensor, width: int) -> None:
        """Keep only the ``inner`` output columns of each d_model-wide block (``width``) of the input
        projections."""
        raise NotImplementedError

    @property
    def fused_projection(self) -> nn.Linear:
        """The input projection that holds several d_model x d_model matrices, one above the other."""
        raise NotImplementedError


class SelfAttention(MultiHeadAttention):
    """Multi-head self-attention: queries, keys and values from the same x through one fused
    (d_model -> 3 d_model) projection. With a :class:`KVCache` (decoding), the new steps' keys and
    values join the cached ones and the new queries attend over all of them. ``positional`` is a
    relative scheme acting inside attention (rotary, Shaw's, a score bias, ALiBi) or the identity."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        positional: PositionalEncoding | None = None,
        bias: bool = True,
        backend: AttentionBackend | None = None,
        scale: nn.Module | None = None,
    ) -> None:
        super().__init__(
            d_model,
            n_heads,
            dropout,
            bias,
            positional,
            backend,
            scale,
            qkv_proj=nn.Linear(d_model, 3 * d_model, bias=bias),
        )  # W^Q | W^K | W^V

    def forward(
        self,
        x: Tensor,
        mask: AttentionMask | Tensor | None = None,
        positions: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """x: (B, T, d_model) (only the new steps with a cache); mask: an AttentionMask over all keys
        (cached ones included) or a boolean tensor broadcastable to (B, H, T, Tk), True = may attend;
        positions: (T,) query and (Tk,) key positions (default: the queries follow the cached steps,
        from 0). -> (B, T, d_model)."""
        q_pos, k_pos = positions if positions is not None else self.default_positions(x, cache)
        mask = as_mask(mask)
        q, k, v = self.split_heads(self.qkv_proj(x), 3)  # (B, H, T, Dh) each
        # the new keys sit at the new queries' positions; cached keys were rotated when they were new
        q, k = self.positional.rotate(q, q_pos), self.positional.rotate(k, q_pos)
        kernel = self.kernel(q, mask)  # the backend that computes this call ('auto': 'sdpa' or 'math')
        # softmax(s q k^T + bias) v over the cached keys and these (the backend keeps these in the cache)
        heads, probs = kernel.compute(
            self.scale(q), k, v, mask, q_pos, k_pos, self.attention_dropout, self.score_bias, cache
        )  # (B, H, T, Dh)
        return self.merge_heads(heads, probs, q_pos, k_pos)  # (B, T, d_model)

    @staticmethod
    def default_positions(x: Tensor, cache: KVCache | None) -> tuple[Tensor, Tensor]:
        """(T,) positions of the new steps, after the cached ones, and (Tk,) of all keys, from 0."""
        end = (len(cache) if cache is not None else 0) + x.shape[1]
        return torch.arange(end - x.shape[1], end, device=x.device), torch.arange(end, device=x.device)

    def keys_values(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values, (B, H, T, Dh) each, of (B, T, d_model) inputs at (T,) positions: what a
        pass over them attends over (Transformer-XL's memory, nn/memory.py)."""
        _, k, v = self.split_heads(self.qkv_proj(x), 3)
        return self.positional.rotate(k, positions), v

    def prune_projections(self, inner: Tensor, width: int) -> None:
        self.qkv_proj = _sliced(self.qkv_proj, outputs=torch.cat([inner, width + inner, 2 * width + inner]))

    @property
    def fused_projection(self) -> nn.Linear:
        return self.qkv_proj


class CrossAttention(MultiHeadAttention):
    """Multi-head cross-attention: queries from the decoder's y through W^Q, keys and values from
    the encoder's output ("memory") through one fused (d_model -> 2 d_model) W^K|W^V. With a
    :class:`KVCache` (decoding), the memory is projected at the first step and reused after."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        backend: AttentionBackend | None = None,
        scale: nn.Module | None = None,
    ) -> None:
        super().__init__(
            d_model,
            n_heads,
            dropout,
            bias,
            None,
            backend,
            scale,
            q_proj=nn.Linear(d_model, d_model, bias=bias),  # W^Q
            kv_proj=nn.Linear(d_model, 2 * d_model, bias=bias),
        )  # W^K | W^V

    def forward(
        self,
        y: Tensor,
        memory: Tensor,
        mask: AttentionMask | Tensor | None = None,
        positions: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """y: (B, T, d_model) queries; memory: (B, S, d_model) keys and values; mask: the memory's
        padding, an AttentionMask or a boolean tensor broadcastable to (B, H, T, S); positions: (T,)
        and (S,) (default: each from 0). -> (B, T, d_model)."""
        q_pos, k_pos = (
            positions
            if positions is not None
            else (torch.arange(y.shape[1], device=y.device), torch.arange(memory.shape[1], device=y.device))
        )
        mask = as_mask(mask)
        (q,) = self.split_heads(self.q_proj(y), 1)  # (B, H, T, Dh)
        k, v = self.memory_keys_values(memory, cache)  # (B, H, S, Dh) each
        kernel = self.kernel(q, mask)  # the backend that computes this call ('auto': 'sdpa' or 'math')
        heads, probs = kernel.compute(
            self.scale(q), k, v, mask, q_pos, k_pos, self.attention_dropout, self.score_bias, None
        )  # softmax(s q k^T) v: (B, H, T, Dh)
        return self.merge_heads(heads, probs, q_pos, k_pos)  # (B, T, d_model)

    def memory_keys_values(self, memory: Tensor, cache: KVCache | None) -> tuple[Tensor, Tensor]:
        """(B, S, d_model) -> keys and values (B, H, S, Dh) each: projected once per decode (the
        ``cache`` keeps them), or at every call without one."""
        if cache is not None and cache.k is not None:
            return cache.k, cache.v
        k, v = self.split_heads(self.kv_proj(memory), 2)
        return (k, v) if cache is None else cache.store(k, v)

    def prune_projections(self, inner: Tensor, width: int) -> None:
        self.q_proj = _sliced(self.q_proj, outputs=inner)
        self.kv_proj = _sliced(self.kv_proj, outputs=torch.cat([inner, width + inner]))

    @property
    def fused_projection(self) -> nn.Linear:
        return self.kv_proj


# -- the exact kernels: the reference ``math``, PyTorch's fused ``sdpa``, and ``auto`` between them -----------


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

    def compute(self, q, k, v, mask, q_pos, k_pos, dropout_p, bias, cache):
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

    def for_call(self, q, mask, dropout_p, need_weights):
        by_math = need_weights or (dropout_p > 0.0 and q.device.type == "cpu")
        return (self.reference if by_math else self.fused).for_call(q, mask, dropout_p, need_weights)


def as_mask(mask: AttentionMask | Tensor | None) -> AttentionMask:
    """An AttentionMask as it is, or a boolean tensor (True = may attend) or None as an explicit one."""
    return mask if isinstance(mask, AttentionMask) else AttentionMask(explicit=mask)


def _sliced(linear: nn.Linear, outputs: Tensor | None = None, inputs: Tensor | None = None) -> nn.Linear:
    """A copy of ``linear`` with only these output rows and input columns (all when None)."""
    weight = linear.weight.detach()
    weight = weight if outputs is None else weight[outputs]
    weight = weight if inputs is None else weight[:, inputs]
    new = nn.Linear(weight.shape[1], weight.shape[0], bias=linear.bias is not None)
    new.weight = nn.Parameter(weight.clone())
    if linear.bias is not None:
        bias = linear.bias.detach()
        new.bias = nn.Parameter((bias if outputs is None else bias[outputs]).clone())
    return new.to(linear.weight.device)


HeadSet = dict[str, list[int]]  # module path -> head indices


def attention_modules(model: nn.Module) -> dict[str, MultiHeadAttention]:
    return {name: m for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)}


def remove_heads(model: nn.Module, heads: HeadSet) -> None:
    """Cut these heads out of the weights (the model gets smaller and faster)."""
    modules = attention_modules(model)
    unknown = sorted(set(heads) - set(modules))
    if unknown:
        raise ValueError(f"no attention module named {unknown[0]!r}")
    for name, head_list in heads.items():
        if head_list:
            modules[name].prune_heads(head_list)
