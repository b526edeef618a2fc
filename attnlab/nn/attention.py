"""Multi-head attention, from the heads to the kernel's call: :class:`SelfAttention` and
:class:`CrossAttention` over the core they share (:class:`MultiHeadAttention`),

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

and cutting heads out of a model's weights (:func:`remove_heads`). Attention itself,
softmax(Q K^T / sqrt(d_k)) V, is computed by the module's backend: the exact kernels (``math``,
``sdpa``, ``auto``) are nn/kernels.py, the blockwise, sparse and linear ones nn/backends/. The scale
of the scores is the paper's unless an ablation replaces it (nn/scores.py: ``NoScale``,
``LearnedScale``), by rescaling the queries before the backend divides by sqrt(d_k).

An attention module asks its backend's ``for_call`` which backend computes the call and calls that
one's ``compute`` itself, so that a GPT block is three calls from PyTorch's kernel:
DecoderLayer -> ResidualConnection -> SelfAttention -> SDPABackend.compute.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from attnlab.nn.cache import KVCache
from attnlab.nn.kernels import AttentionBackend, BiasFn
from attnlab.nn.masks import AttentionMask
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.scores import PaperScale


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

    qkv_proj: nn.Linear  # W^Q | W^K | W^V, registered by MultiHeadAttention's __init__

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

    q_proj: nn.Linear  # W^Q and W^K | W^V, registered by MultiHeadAttention's __init__
    kv_proj: nn.Linear

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
            return cache.k, cast(Tensor, cache.v)  # stored with k
        k, v = self.split_heads(self.kv_proj(memory), 2)
        return (k, v) if cache is None else cache.store(k, v)

    def prune_projections(self, inner: Tensor, width: int) -> None:
        self.q_proj = _sliced(self.q_proj, outputs=inner)
        self.kv_proj = _sliced(self.kv_proj, outputs=torch.cat([inner, width + inner]))

    @property
    def fused_projection(self) -> nn.Linear:
        return self.kv_proj


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
