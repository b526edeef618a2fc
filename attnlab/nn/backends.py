"""How softmax(Q K^T / sqrt(d) + bias) V is computed: one config string, ``attention_backend``.

==========  ==========================================================  =====================
backend     computation                                                 cost in T (keys)
==========  ==========================================================  =====================
math        explicit scores, the reference; the only one with weights   O(T^2) time, memory
sdpa        torch's scaled_dot_product_attention (fused kernels)        O(T^2) time
chunked     exact, block by block with an online softmax; backward      O(T^2) time, O(T) memory
            recomputes each query block (never the T x T matrix)
local       a sliding window |i - j| <= w, blockwise                    O(T w)
sparse      window + "fixed" strided summaries + global tokens +        O(T (w + T/s + g + r b))
            random key blocks (Sparse Transformer / Longformer / BigBird)
linear      phi(Q) (phi(K)^T V), phi = elu + 1 or positive random       O(T m d)
            features (Performer); causal by chunked prefix sums, and
            an O(1)-per-step recurrent state when decoding
==========  ==========================================================  =====================

Every backend takes queries (B, H, Tq, D), keys and values (B, H, Tk, D), an :class:`AttentionMask`
(padding and causality as structure, so that no backend has to build a (Tq, Tk) matrix), the
queries' and keys' positions (Tq,), (Tk,), the attention-dropout probability and an optional
``bias(q, q_pos, k_pos)`` of additive scores (relative / ALiBi positions). With a self-attention
cache, the backend decides what the cache keeps: all keys and values, or linear attention's state.
``local`` and ``sparse`` give exactly what ``math`` gives under the same pattern as an explicit
mask (:meth:`SparsePattern.allowed`); ``linear`` is a different model of attention, exact only
with respect to its own kernel formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
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



class AttentionBackend:
    """The reference, ``math``: explicit scores, the only backend that can return the weights."""

    name = "math"
    returns_weights = True  # can give the (B, H, Tq, Tk) probabilities
    takes_explicit_mask = True  # accepts an arbitrary boolean mask besides padding and causality
    exact = True  # computes softmax attention over every allowed key (what 'math' computes)

    @classmethod
    def from_config(cls, cfg) -> "AttentionBackend":
        """The backend with its own fields of a ModelConfig (attention_block, attention_window, ...)."""
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
        """Self-attention of new steps after cached ones: by default, over all keys and values so far."""
        k, v = cache.append(k, v)
        return self.compute(q, k, v, mask, q_pos, k_pos, dropout_p, bias)

    def compute(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, q_pos: Tensor, k_pos: Tensor,
                dropout_p: float, bias: BiasFn | None) -> tuple[Tensor, Tensor | None]:
        b = bias(q, q_pos, k_pos) if bias is not None else None
        return attention(q, k, v, mask.dense(q_pos, k_pos), dropout_p, bias=b, need_weights=True)


class SDPABackend(AttentionBackend):
    """``torch.nn.functional.scaled_dot_product_attention``: PyTorch picks a flash, memory-efficient
    or C++ kernel. Padding and bias travel as one float mask; causality without padding or bias as
    ``is_causal``, which lets the fused kernels skip the masked half."""

    name = "sdpa"
    returns_weights = False

    def compute(self, q, k, v, mask, q_pos, k_pos, dropout_p, bias):
        b = bias(q, q_pos, k_pos) if bias is not None else None
        square_causal = mask.causal and mask.key_valid is None and mask.explicit is None and q.shape[2] == k.shape[2]
        if b is None and square_causal:  # no (Tq, Tk) mask to build
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True), None
        allowed = mask.dense(q_pos, k_pos)
        if b is None and allowed is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p), None
        # half the most negative value: adding a bias cannot overflow to -inf, so no row becomes NaN
        attn_mask = b if allowed is None else torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(
            ~allowed, torch.finfo(q.dtype).min / 2) + (0.0 if b is None else b)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        if allowed is not None:  # a query with no allowed key: zeros, as in 'math' (not a uniform mix)
            out = out.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
        return out, None


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

    def __init__(self, q_block: int = 128, k_block: int = 1024) -> None:
        self.q_block, self.k_block = q_block, k_block

    @classmethod
    def from_config(cls, cfg) -> "ChunkedBackend":
        return cls(cfg.attention_block, cfg.attention_key_block)

    def compute(self, q, k, v, mask, q_pos, k_pos, dropout_p, bias):
        params = _bias_parameters(bias)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *params)):
            return _ChunkedAttention.apply(self, mask, q_pos, k_pos, dropout_p, bias, q, k, v, *params), None
        return self.blocks(q, k, v, mask, q_pos, k_pos, dropout_p, bias), None

    def blocks(self, q, k, v, mask, q_pos, k_pos, dropout_p, bias) -> Tensor:
        """All query blocks, in order: (B, H, Tq, Dv)."""
        return torch.cat([self._query_block(q[:, :, rows], k, v, mask, q_pos[rows], k_pos, dropout_p, bias)
                          for rows in self.query_blocks(q.shape[2])], dim=2)

    def query_blocks(self, n: int) -> list[slice]:
        return [slice(start, start + self.q_block) for start in range(0, n, self.q_block)]

    def _query_block(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, q_pos: Tensor, k_pos: Tensor,
                     dropout_p: float, bias: BiasFn | None) -> Tensor:
        """(B, H, bq, D) queries over all keys, one key block at a time -> (B, H, bq, Dv)."""
        lowest = torch.finfo(q.dtype).min
        m = q.new_full((*q.shape[:3], 1), lowest)  # running row maximum
        l = q.new_zeros((*q.shape[:3], 1))  # running normaliser sum_j e^(s_j - m)
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
                s = s + bias(q, q_pos, kp)
            allowed = mask.dense(q_pos, kp, cols)
            if allowed is not None:
                s = s.masked_fill(~allowed, lowest)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            if allowed is not None:
                p = p.masked_fill(~allowed, 0.0)
            rescale = torch.exp(m - m_new)
            l = l * rescale + p.sum(-1, keepdim=True)
            acc = acc * rescale + dropout(p, dropout_p) @ v[:, :, cols]
            m = m_new
        return torch.where(l > 0, acc / l.clamp_min(torch.finfo(l.dtype).tiny), 0.0)


def _bias_parameters(bias: BiasFn | None) -> list[Tensor]:
    """The learned parameters behind a positional score bias (a relative-bias table), if any."""
    owner = getattr(bias, "__self__", None)
    return list(owner.parameters()) if isinstance(owner, torch.nn.Module) else []


class _ChunkedAttention(torch.autograd.Function):
    """Chunked attention with a memory-light backward: the forward keeps only Q, K, V and the RNG
    state; the backward recomputes each query block under autograd, with that RNG state (the same
    dropout masks, since the blocks draw in the same order), takes the block's gradients and lets
    it go before the next. Gradients reach the score bias's parameters too."""

    @staticmethod
    def forward(ctx, backend, mask, q_pos, k_pos, dropout_p, bias, q, k, v, *params):
        ctx.rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state(q.device) if q.is_cuda else None
        ctx.args = (backend, mask, q_pos, k_pos, dropout_p, bias)
        ctx.save_for_backward(q, k, v, *params)
        return backend.blocks(q, k, v, mask, q_pos, k_pos, dropout_p, bias)

    @staticmethod
    def backward(ctx, grad_out):
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
                grads = torch.autograd.grad(out, [q_leaf, k_leaf, v_leaf, *params], grad_out[:, :, rows],
                                            allow_unused=True)
                dq[:, :, rows] = grads[0]
                for total, g in zip([dk, dv, *dparams], grads[1:]):
                    if g is not None:
                        total += g
        return (None, None, None, None, None, None, dq, dk, dv, *dparams)


@dataclass(frozen=True)
class SparsePattern:
    """Which keys a query may see, as a union of patterns (a causal mask and padding come on top):

    - window:  |i - j| <= window (Longformer's sliding window; ``local`` is this alone);
    - stride:  the last position of every ``stride`` keys, j mod stride = stride - 1 (the "fixed"
               summaries of Child et al. 2019); 0 turns it off;
    - n_global: the first ``n_global`` positions see all keys and are seen by all queries;
    - n_random: each block of ``block`` queries also sees ``n_random`` key blocks drawn with ``seed``
               (BigBird), the same draw every call.
    """

    window: int
    stride: int = 0
    n_global: int = 0
    n_random: int = 0
    block: int = 64
    seed: int = 0

    def random_blocks(self, query_block: int, n_keys: int, causal: bool) -> Tensor:
        """The key blocks that query block ``query_block`` sees at random: (<= n_random,) indices,
        drawn from the blocks of ``n_keys`` keys, or with a causal mask from blocks 0..query_block
        (so that a decoding step draws what the full pass drew)."""
        n_blocks = query_block + 1 if causal else -(-n_keys // self.block)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + query_block)
        return torch.randperm(n_blocks, generator=g)[: self.n_random]

    def _random(self, q_pos: Tensor, k_pos: Tensor, n_keys: int, causal: bool) -> Tensor:
        """(Tq, Tk) bool: the keys each query sees through its block's random key blocks."""
        chosen = torch.zeros(q_pos.numel(), k_pos.numel(), dtype=torch.bool, device=k_pos.device)
        for qb in torch.unique(q_pos // self.block).tolist():
            blocks = self.random_blocks(qb, n_keys, causal).to(k_pos.device)
            chosen |= (q_pos // self.block == qb)[:, None] & torch.isin(k_pos // self.block, blocks)[None, :]
        return chosen

    def allowed(self, q_pos: Tensor, k_pos: Tensor, n_keys: int, causal: bool = False) -> Tensor:
        """(Tq,), (Tk,) positions of queries and (some of) ``n_keys`` keys -> (Tq, Tk) bool: the
        pattern as an explicit mask (causality itself is the AttentionMask's, not applied here)."""
        allowed = (k_pos[None, :] - q_pos[:, None]).abs() <= self.window
        if self.stride:
            allowed |= (k_pos % self.stride == self.stride - 1)[None, :]
        if self.n_global:
            allowed |= (k_pos < self.n_global)[None, :] | (q_pos < self.n_global)[:, None]
        if self.n_random:
            allowed |= self._random(q_pos, k_pos, n_keys, causal)
        return allowed

    def candidate_keys(self, q_pos: Tensor, k_pos: Tensor, causal: bool = False) -> Tensor:
        """Indices into the keys that cover every key one block of queries may see: (n,) ascending."""
        if self.n_global and bool((q_pos < self.n_global).any()):
            return torch.arange(k_pos.numel(), device=k_pos.device)  # a global query sees everything
        keep = (k_pos >= int(q_pos.min()) - self.window) & (k_pos <= int(q_pos.max()) + self.window)
        if self.stride:
            keep |= k_pos % self.stride == self.stride - 1
        if self.n_global:
            keep |= k_pos < self.n_global
        if self.n_random:
            keep |= self._random(q_pos, k_pos, k_pos.numel(), causal).any(0)
        return keep.nonzero().squeeze(1)


class SparseBackend(AttentionBackend):
    """Attention restricted to a :class:`SparsePattern`, computed block by block: each block of
    ``pattern.block`` queries gathers only its candidate keys, so the cost is O(T x keys per query),
    and the result equals ``math`` under ``pattern.allowed`` as an explicit mask."""

    name = "sparse"
    returns_weights = False
    takes_explicit_mask = False
    exact = False  # attends to the pattern's keys only

    @classmethod
    def from_config(cls, cfg) -> "SparseBackend":
        return cls(SparsePattern(cfg.attention_window, cfg.sparse_stride, cfg.sparse_global, cfg.sparse_random,
                                 cfg.attention_block))

    def __init__(self, pattern: SparsePattern) -> None:
        self.pattern = pattern

    def compute(self, q, k, v, mask, q_pos, k_pos, dropout_p, bias):
        block = self.pattern.block
        if block <= 0:
            raise ValueError("sparse attention needs a block size of at least 1")
        outputs = []
        for start in range(0, q.shape[2], block):
            rows = slice(start, start + block)
            qp = q_pos[rows]
            keys = self.pattern.candidate_keys(qp, k_pos, mask.causal)  # (n,)
            kp = k_pos[keys]
            allowed = self.pattern.allowed(qp, kp, k_pos.numel(), mask.causal)  # (bq, n)
            structural = mask.dense(qp, kp, keys)
            allowed = allowed if structural is None else structural & allowed
            b = bias(q[:, :, rows], qp, kp) if bias is not None else None
            out, _ = attention(q[:, :, rows], k.index_select(2, keys), v.index_select(2, keys), allowed,
                               dropout_p, bias=b)
            outputs.append(out)
        return torch.cat(outputs, dim=2), None


class LocalBackend(SparseBackend):
    """A sliding window of +-``window`` keys (with a causal mask: the ``window`` before and the
    query itself): the sparse pattern with nothing but the window, in blocks of ``block`` queries."""

    name = "local"

    def __init__(self, window: int, block: int = 64) -> None:
        super().__init__(SparsePattern(window=window, block=block))

    @classmethod
    def from_config(cls, cfg) -> "LocalBackend":
        return cls(cfg.attention_window, cfg.attention_block)


class FeatureMap:
    """phi for linear attention: ``elu`` (Katharopoulos et al. 2020: elu(x) + 1), or ``favor``
    (Performer, Choromanski et al. 2021: positive orthogonal random features
    exp(w^T x - |x|^2 / 2) / sqrt(m) of x = q / d^(1/4), whose dot products estimate exp(q.k / sqrt(d)))."""

    def __init__(self, kind: str, d_head: int, n_features: int = 64, seed: int = 0) -> None:
        self.kind = kind
        self.projection: Tensor | None = None
        if kind == "favor":
            g = torch.Generator().manual_seed(seed)
            blocks = []
            for _ in range(math.ceil(n_features / d_head)):  # orthogonal rows, norms as for Gaussian rows
                q_, _ = torch.linalg.qr(torch.randn(d_head, d_head, generator=g))
                blocks.append(q_.T)
            w = torch.cat(blocks)[:n_features]
            norms = torch.randn(n_features, d_head, generator=g).norm(dim=1, keepdim=True)
            self.projection = w * norms  # (m, d)

    def __call__(self, x: Tensor) -> Tensor:
        """(..., T, d) -> (..., T, m) non-negative features."""
        if self.projection is None:
            return F.elu(x) + 1.0
        x = x / x.shape[-1] ** 0.25
        w = self.projection.to(device=x.device, dtype=x.dtype)
        # exp(w x - |x|^2/2 - c) with c the row max of w x for stability; c cancels in the ratio
        wx = x @ w.T  # (..., T, m)
        stabiliser = wx.detach().amax(dim=(-1, -2), keepdim=True)
        return torch.exp(wx - (x * x).sum(-1, keepdim=True) / 2 - stabiliser) / math.sqrt(w.shape[0])


class LinearState:
    """Linear attention's decoding state, O(1) per step: S = sum_j phi(k_j) v_j^T (B, H, m, Dv) and
    z = sum_j phi(k_j) (B, H, m) over the keys so far; kept in the self-attention cache."""

    def __init__(self, S: Tensor, z: Tensor, length: int) -> None:
        self.S, self.z, self.length = S, z, length

    def reorder(self, index: Tensor) -> None:
        self.S, self.z = self.S.index_select(0, index), self.z.index_select(0, index)


class LinearBackend(AttentionBackend):
    """Kernelised attention: out_i = phi(q_i)^T S_i / phi(q_i)^T z_i with S_i, z_i the sums of
    phi(k_j) v_j^T and phi(k_j) over the keys query i may see (all real keys, or with a causal
    mask those up to i). The causal form runs over chunks of ``chunk`` positions: within a chunk an
    explicit masked (chunk x chunk) product, across chunks the running sums, so memory is O(T m),
    not O(T m Dv). With a cache the state is all that is kept between steps."""

    name = "linear"
    returns_weights = False
    takes_explicit_mask = False
    exact = False  # a different model of attention (its own kernel formula)

    def __init__(self, feature_map: FeatureMap, chunk: int = 128) -> None:
        self.phi, self.chunk = feature_map, chunk

    @classmethod
    def from_config(cls, cfg) -> "LinearBackend":
        return cls(FeatureMap(cfg.linear_features, cfg.d_head, cfg.linear_n_features), cfg.attention_block)

    def compute(self, q, k, v, mask, q_pos, k_pos, dropout_p, bias):
        return self._kernelised(q, k, v, mask, dropout_p, bias, cache=None, key_valid=mask.key_valid), None

    def compute_cached(self, q, k, v, mask, q_pos, k_pos, dropout_p, bias, cache):
        """Only the running sums are kept: the new keys update them (the last Tk' keys of the mask)."""
        key_valid = None if mask.key_valid is None else mask.key_valid[:, -k.shape[2]:]
        return self._kernelised(q, k, v, mask, dropout_p, bias, cache, key_valid), None

    def _kernelised(self, q, k, v, mask, dropout_p, bias, cache, key_valid) -> Tensor:
        if bias is not None or dropout_p > 0.0:
            raise ValueError("linear attention takes no score bias or attention dropout")
        fq, fk = self.phi(q), self.phi(k)  # (B, H, Tq, m), (B, H, Tk', m) for the new keys
        if key_valid is not None:
            fk = fk * key_valid[:, None, :, None].to(fk.dtype)  # padded keys add nothing to the sums
        if not mask.causal:
            if cache is not None:
                raise ValueError("linear attention keeps a decoding state for causal self-attention only")
            S, z = fk.transpose(-2, -1) @ v, fk.sum(2)  # (B, H, m, Dv), (B, H, m)
            return self._normalise(fq @ S, fq @ z[..., None])
        out, state = self._causal(fq, fk, v, cache.state if cache is not None else None)
        if cache is not None:
            cache.state = state
        return out

    def _causal(self, fq: Tensor, fk: Tensor, v: Tensor, state: LinearState | None) -> tuple[Tensor, LinearState]:
        """Queries and keys at the same positions, after the ``state``'s keys."""
        B, H, T, m = fq.shape
        S = fq.new_zeros(B, H, m, v.shape[-1]) if state is None else state.S
        z = fq.new_zeros(B, H, m) if state is None else state.z
        numerators, denominators = [], []
        for start in range(0, T, self.chunk):
            c = slice(start, start + self.chunk)
            a = (fq[:, :, c] @ fk[:, :, c].transpose(-2, -1)).tril()  # (B, H, t, t): j <= i in the chunk
            numerators.append(fq[:, :, c] @ S + a @ v[:, :, c])
            denominators.append(fq[:, :, c] @ z[..., None] + a.sum(-1, keepdim=True))
            S = S + fk[:, :, c].transpose(-2, -1) @ v[:, :, c]
            z = z + fk[:, :, c].sum(2)
        out = self._normalise(torch.cat(numerators, 2), torch.cat(denominators, 2))
        return out, LinearState(S, z, (0 if state is None else state.length) + T)

    @staticmethod
    def _normalise(numerator: Tensor, denominator: Tensor) -> Tensor:
        """numerator / denominator, zero where no key contributed (a fully padded row)."""
        return torch.where(denominator > 0, numerator / denominator.clamp_min(torch.finfo(numerator.dtype).tiny), 0.0)
