"""``linear``: kernelised attention phi(Q) (phi(K)^T V), with an O(1)-per-step decoding state."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.errors import ConfigError
from attnlab.nn.cache import KVCache
from attnlab.nn.kernels import AttentionBackend, BiasFn, option_at_least
from attnlab.nn.masks import AttentionMask

FEATURE_MAPS = ("elu", "favor")  # elu + 1 (Katharopoulos et al.), positive random features (Performer's FAVOR+)


@dataclass(frozen=True)
class LinearOptions:
    """``linear``'s own options (``model.backends.linear``): the ``feature_map`` phi and, for favor,
    its number of ``random_features`` m."""

    feature_map: str = "elu"
    random_features: int = 64

    def __post_init__(self) -> None:
        if self.feature_map not in FEATURE_MAPS:
            raise ConfigError(
                f"feature_map must be one of {', '.join(map(repr, FEATURE_MAPS))} (got {self.feature_map!r})"
            )
        option_at_least("random_features", self.random_features, 1)


class FeatureMap:
    """phi for linear attention: ``elu`` (Katharopoulos et al. 2020: elu(x) + 1), or ``favor``
    (Performer, Choromanski et al. 2021: positive orthogonal random features
    ``exp(w^T x - |x|^2 / 2) / sqrt(m)`` of x = q / d^(1/4), whose dot products estimate exp(q.k / sqrt(d)))."""

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
    score_bias = False  # it never forms scores
    attention_dropout = False  # nor probabilities to drop
    static_cache = False  # its cache holds the running sums S, z, not keys at positions
    fields = ("linear.feature_map", "linear.random_features")

    def __init__(self, feature_map: FeatureMap, chunk: int = 128) -> None:
        self.phi, self.chunk = feature_map, chunk

    @classmethod
    def from_config(cls, cfg: Any) -> "LinearBackend":
        options = cfg.backends.linear
        return cls(FeatureMap(options.feature_map, cfg.stack.d_head, options.random_features), cfg.backends.block)

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
        """With a cache, only the running sums are kept: the new keys update them, and their padding
        is the mask's last Tk' columns (without one, those are all of them)."""
        key_valid = None if mask.key_valid is None else mask.key_valid[:, -k.shape[2] :]
        return self._kernelised(q, k, v, mask, dropout_p, bias, cache, key_valid), None

    def _kernelised(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttentionMask,
        dropout_p: float,
        bias: BiasFn | None,
        cache: KVCache | None,
        key_valid: Tensor | None,
    ) -> Tensor:
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
        # the state a cache holds here is the one this backend put there (below): a LinearState, or None at first
        out, state = self._causal(fq, fk, v, cast("LinearState | None", cache.state) if cache is not None else None)
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
