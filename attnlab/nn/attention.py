"""Multi-head attention.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Attention itself, softmax(Q K^T / sqrt(d_k)) V, is computed by a backend (nn/backends/): the
explicit reference ``attention`` or one of the fused, blockwise, sparse or linear ones. The scale
of the scores is the paper's unless an ablation replaces it (``NoScale``: none; ``LearnedScale``),
by rescaling the queries before the backend divides by sqrt(d_k).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.nn.backends import AttentionBackend
from attnlab.nn.cache import KVCache
from attnlab.nn.masks import AttentionMask
from attnlab.nn.positional import PositionalEncoding


class PaperScale(nn.Identity):
    """Scores q . k / sqrt(d_k), the paper's (the backends divide by sqrt(d_k)): queries unchanged."""

    def __init__(self, d_head: int) -> None:
        super().__init__()


class NoScale(nn.Module):
    """Scores q . k, unscaled (the ablation): queries times sqrt(d_k), which the backends divide away."""

    def __init__(self, d_head: int) -> None:
        super().__init__()
        self.factor = d_head ** 0.5

    def forward(self, q: Tensor) -> Tensor:
        return q * self.factor


class LearnedScale(nn.Module):
    """Scores s q . k with a learned s per attention module, from s = 1 / sqrt(d_k)."""

    def __init__(self, d_head: int) -> None:
        super().__init__()
        self.sqrt_d = d_head ** 0.5
        self.scale = nn.Parameter(torch.tensor(1 / self.sqrt_d))

    def forward(self, q: Tensor) -> Tensor:
        return q * (self.scale * self.sqrt_d).to(q.dtype)


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
        backend: AttentionBackend | None = None,
        scale: nn.Module | None = None,
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
        self.backend = backend if backend is not None else AttentionBackend()
        self.scale = scale if scale is not None else PaperScale(self.d_head)  # what multiplies q . k
        self.head_gate: Tensor | None = None  # (H,) multiplies each head's output (head importance, masking)

    def _heads(self, x: Tensor, n: int) -> tuple[Tensor, ...]:
        """(B, T, n * d_model) -> n tensors (B, H, T, Dh)."""
        B, T, _ = x.shape
        return x.view(B, T, n, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: AttentionMask | Tensor | None = None,
        positions: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x: (B, Tq, d_model) queries (and keys/values for self-attention); memory: (B, Tk, d_model)
        keys/values for cross-attention; mask: an AttentionMask over all keys (cached ones included),
        or a boolean tensor broadcastable to (B, H, Tq, Tk), True = may attend; positions: (Tq,)
        query and (Tk,) key positions (default: the queries follow the cached steps, from 0).
        Returns (B, Tq, d_model) and, with ``need_weights``, per-head weights (B, H, Tq, Tk).
        """
        mask = mask if isinstance(mask, AttentionMask) else AttentionMask(explicit=mask)
        if positions is None:
            offset = len(cache) if cache is not None and not self.cross else 0
            q_pos = torch.arange(offset, offset + x.shape[1], device=x.device)
            k_pos = torch.arange((memory.shape[1] if self.cross else offset + x.shape[1]), device=x.device)
        else:
            q_pos, k_pos = positions
        if self.cross:
            (q,) = self._heads(self.q_proj(x), 1)
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v
            else:
                k, v = self._heads(self.kv_proj(memory), 2)  # (B, H, Tk, Dh) each
                if cache is not None:
                    k, v = cache.store(k, v)
            self_cache = None
        else:
            q, k, v = self._heads(self.qkv_proj(x), 3)  # (B, H, Tq, Dh) each
            # the new keys sit at the new queries' positions; cached keys were rotated when they were new
            q, k = self.positional.rotate(q, q_pos), self.positional.rotate(k, q_pos)
            self_cache = cache  # the backend appends to it (or updates its own state)
        out, probs = self.backend(
            self.scale(q), k, v, mask, q_pos, k_pos,
            dropout_p=self.dropout_p if self.training else 0.0,
            bias=self.positional.score_bias if self.positional.biases_scores else None,
            need_weights=need_weights or self.positional.needs_probs,
            cache=self_cache,
        )  # (B, H, Tq, Dh)
        value_term = self.positional.value_term(probs, q_pos, k_pos)
        if value_term is not None:
            out = out + value_term
        if self.head_gate is not None:
            out = out * self.head_gate.to(out.dtype)[None, :, None, None]
        B, H, Tq, Dh = out.shape
        out = self.out_proj(out.transpose(1, 2).reshape(B, Tq, H * Dh))  # (B, Tq, d_model)
        return out, (probs if need_weights else None)

    def keys_values(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Self-attention's keys and values, (B, H, T, Dh) each, of (B, T, d_model) inputs at (T,)
        positions: what a pass over them attends over (Transformer-XL's memory, nn/memory.py)."""
        _, k, v = self._heads(self.qkv_proj(x), 3)
        return self.positional.rotate(k, positions), v

    def prune_heads(self, heads: list[int]) -> None:
        """Remove these heads from the weights (Michel et al. 2019): their rows of the Q, K and V
        projections, their columns of the output projection, and their share of per-head positional
        parameters. The layer then computes exactly what it computed with those heads gated to zero."""
        keep = [h for h in range(self.n_heads) if h not in set(heads)]
        if not keep:
            raise ValueError("pruning would remove every head of a layer; keep at least one")
        per_head = torch.arange(self.d_head)
        inner = torch.cat([h * self.d_head + per_head for h in keep])  # columns of the kept heads
        width = self.n_heads * self.d_head
        if self.cross:
            self.q_proj = _sliced(self.q_proj, outputs=inner)
            self.kv_proj = _sliced(self.kv_proj, outputs=torch.cat([inner, width + inner]))
        else:
            self.qkv_proj = _sliced(self.qkv_proj, outputs=torch.cat([inner, width + inner, 2 * width + inner]))
        self.out_proj = _sliced(self.out_proj, inputs=inner)
        self.positional.keep_heads(torch.tensor(keep))
        if self.head_gate is not None:
            self.head_gate = self.head_gate[keep]
        self.n_heads = len(keep)


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
