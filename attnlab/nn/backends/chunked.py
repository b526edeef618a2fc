"""``chunked``: exact attention block by block with an online softmax, and a backward that
recomputes one query block at a time (memory O(T), never the T x T matrix)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.nn.cache import KVCache
from attnlab.nn.dropout import dropout
from attnlab.nn.kernels import AttentionBackend, BiasFn, SDPABackend, keys_so_far, option_at_least
from attnlab.nn.masks import AttentionMask


@dataclass(frozen=True)
class ChunkedOptions:
    """``chunked``'s own option (``model.backends.chunked``): ``key_block``, the keys visited at a time."""

    key_block: int = 1024

    def __post_init__(self) -> None:
        option_at_least("key_block", self.key_block, 1)


class ChunkedBackend(AttentionBackend):
    """Exact attention by blocks (Rabe & Staats 2021; the FlashAttention recurrence): for each
    block of ``q_block`` queries, keys are visited ``k_block`` at a time with a running maximum m,
    normaliser l and output acc, so no (Tq, Tk) tensor exists:

        m' = max(m, rowmax(S_j)),  l = e^(m - m') l + rowsum(e^(S_j - m')),  acc = e^(m - m') acc + e^(S_j - m') V_j

    and the output is acc / l. The backward (:class:`_ChunkedAttention`) recomputes one query block
    at a time, with the forward's RNG state (so the same dropout masks), takes that block's
    gradients and frees it before the next, so memory grows with T, not T^2. Key blocks entirely
    in a causal query block's future are skipped."""

    name = "chunked"
    returns_weights = False
    takes_explicit_mask = False
    fields = ("chunked.key_block",)

    def __init__(self, q_block: int = 128, k_block: int = 1024) -> None:
        self.q_block, self.k_block = q_block, k_block

    @classmethod
    def from_config(cls, cfg: Any) -> "ChunkedBackend":
        return cls(cfg.backends.block, cfg.backends.chunked.key_block)

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
        if q.is_cuda and bias is None and SDPABackend.takes_no_mask_matrix(mask, q, k):
            # PyTorch's flash kernel is this same recurrence, fused: as exact, O(T) memory (the loop over
            # blocks here took 67x sdpa's time at T = 16k on an H100, issue 18)
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=mask.causal), None
        params = _bias_parameters(bias)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *params)):
            # Function.apply is untyped in PyTorch: it returns what forward returns
            apply = cast(Callable[..., Tensor], _ChunkedAttention.apply)
            return apply(self, mask, q_pos, k_pos, dropout_p, bias, q, k, v, *params), None
        return self.blocks(q, k, v, mask, q_pos, k_pos, dropout_p, bias), None

    def blocks(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttentionMask,
        q_pos: Tensor,
        k_pos: Tensor,
        dropout_p: float,
        bias: BiasFn | None,
    ) -> Tensor:
        """All query blocks, in order: (B, H, Tq, Dv)."""
        return torch.cat(
            [
                self._query_block(q[:, :, rows], k, v, mask, q_pos[rows], k_pos, dropout_p, bias)
                for rows in self.query_blocks(q.shape[2])
            ],
            dim=2,
        )

    def query_blocks(self, n: int) -> list[slice]:
        return [slice(start, start + self.q_block) for start in range(0, n, self.q_block)]

    def _query_block(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttentionMask,
        q_pos: Tensor,
        k_pos: Tensor,
        dropout_p: float,
        bias: BiasFn | None,
    ) -> Tensor:
        """(B, H, bq, D) queries over all keys, one key block at a time -> (B, H, bq, Dv)."""
        lowest = torch.finfo(q.dtype).min
        m = q.new_full((*q.shape[:3], 1), lowest)  # running row maximum
        row_sum = q.new_zeros((*q.shape[:3], 1))  # running normaliser l = sum_j e^(s_j - m)
        acc = q.new_zeros((*q.shape[:3], v.shape[-1]))  # running sum_j e^(s_j - m) v_j
        scale = 1.0 / math.sqrt(q.shape[-1])
        last_query = q_pos.max()
        for start in range(0, k.shape[2], self.k_block):
            cols = slice(start, start + self.k_block)
            kp = k_pos[cols]
            if mask.causal and bool(kp.min() > last_query):
                continue  # every key here is in every query's future
            s = q @ k[:, :, cols].transpose(-2, -1) * scale  # (B, H, bq, bk)
            if bias is not None:
                # a bias reaches a backend only from positions that add scores: a tensor, never None
                s = s + cast(Tensor, bias(q, q_pos, kp))
            allowed = mask.dense(q_pos, kp, cols)
            if allowed is not None:
                s = s.masked_fill(~allowed, lowest)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            if allowed is not None:
                p = p.masked_fill(~allowed, 0.0)
            rescale = torch.exp(m - m_new)
            row_sum = row_sum * rescale + p.sum(-1, keepdim=True)
            acc = acc * rescale + dropout(p, dropout_p) @ v[:, :, cols]
            m = m_new
        return torch.where(row_sum > 0, acc / row_sum.clamp_min(torch.finfo(row_sum.dtype).tiny), 0.0)


def _bias_parameters(bias: BiasFn | None) -> list[Tensor]:
    """The learned parameters behind a positional score bias (a relative-bias table), if any."""
    owner = getattr(bias, "__self__", None)
    return list(owner.parameters()) if isinstance(owner, torch.nn.Module) else []


class _ChunkedContext(Protocol):
    """What :class:`_ChunkedAttention`'s ``ctx`` carries from its forward to its backward."""

    rng: Tensor
    cuda_rng: Tensor | None
    args: tuple[ChunkedBackend, AttentionMask, Tensor, Tensor, float, BiasFn | None]
    saved_tensors: tuple[Tensor, ...]

    def save_for_backward(self, *tensors: Tensor) -> None: ...


class _ChunkedAttention(torch.autograd.Function):
    """Chunked attention with a memory-light backward: the forward keeps only Q, K, V and the RNG
    state; the backward recomputes each query block under autograd, with that RNG state (the same
    dropout masks, since the blocks draw in the same order), takes the block's gradients and lets
    it go before the next. Gradients reach the score bias's parameters too."""

    @staticmethod
    def forward(
        ctx: _ChunkedContext,
        backend: ChunkedBackend,
        mask: AttentionMask,
        q_pos: Tensor,
        k_pos: Tensor,
        dropout_p: float,
        bias: BiasFn | None,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *params: Tensor,
    ) -> Tensor:
        ctx.rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state(q.device) if q.is_cuda else None
        ctx.args = (backend, mask, q_pos, k_pos, dropout_p, bias)
        ctx.save_for_backward(q, k, v, *params)
        return backend.blocks(q, k, v, mask, q_pos, k_pos, dropout_p, bias)

    @staticmethod
    def backward(ctx: _ChunkedContext, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        backend, mask, q_pos, k_pos, dropout_p, bias = ctx.args
        q, k, v, *params = ctx.saved_tensors
        k_leaf, v_leaf = k.detach().requires_grad_(), v.detach().requires_grad_()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dparams = [torch.zeros_like(p) for p in params]
        with torch.random.fork_rng(devices=[q.device] if q.is_cuda else []), torch.enable_grad():
            torch.set_rng_state(ctx.rng)
            if ctx.cuda_rng is not None:
                torch.cuda.set_rng_state(ctx.cuda_rng, q.device)
            for rows in backend.query_blocks(q.shape[2]):
                q_leaf = q[:, :, rows].detach().requires_grad_()
                out = backend._query_block(q_leaf, k_leaf, v_leaf, mask, q_pos[rows], k_pos, dropout_p, bias)
                grads = torch.autograd.grad(
                    out, [q_leaf, k_leaf, v_leaf, *params], grad_out[:, :, rows], allow_unused=True
                )
                dq[:, :, rows] = grads[0]
                for total, g in zip([dk, dv, *dparams], grads[1:]):
                    if g is not None:
                        total += g
        return (None, None, None, None, None, None, dq, dk, dv, *dparams)
