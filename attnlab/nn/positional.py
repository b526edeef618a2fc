"""Positional encodings.

Self-attention alone is permutation-equivariant; each class here tells it where tokens are, at one
of four hooks a :class:`PositionalEncoding` may implement:

========================  ==============================================================  =========
hook                      what it changes                                                 used by
========================  ==============================================================  =========
``embed``                 the input vectors: x = E[w] (+ or ||) PE(pos)                   sinusoidal(_halves), learned
``rotate``                queries and keys before their dot product                      rotary
``score_bias``            an additive term on the scaled scores                          relative, relative_bias, alibi
``value_term``            an additive term on the attention output                       relative
========================  ==============================================================  =========

Absolute encodings (``absolute = True``) sit once at the embeddings; the others sit in every
self-attention module. Positions are integer tensors: (T,) for the embeddings, (Tq,) and (Tk,) for
queries and keys inside attention. A new variant is one class here plus one line in registry.py.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn


class PositionalEncoding(nn.Module):
    """No positions at all (``positions.scheme: none``); also the base class, identity at every hook."""

    absolute: ClassVar[bool] = False
    biases_scores: ClassVar[bool] = False  # score_bias gives a term (the backend must add it)

    @classmethod
    def from_config(cls, cfg: Any) -> "PositionalEncoding":
        return cls()

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """(B, T, D_tok) token vectors, (T,) positions -> (B, T, d_model) inputs of the first layer."""
        return tokens

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """(B, H, T, Dh) queries or keys at (T,) positions -> the same, position-dependent."""
        return x

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """Term added to the scaled scores, broadcastable to (B, H, Tq, Tk); None when there is none."""
        return None

    def value_term(self, probs: Tensor | None, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """Term added to the attention output (B, H, Tq, Dh), given (B, H, Tq, Tk) weights (None from a
        backend that does not form them: never when ``needs_probs``)."""
        return None

    @property
    def needs_probs(self) -> bool:
        """True when ``value_term`` needs the attention weights (attention must return them)."""
        return False

    def keep_heads(self, keep: Tensor) -> None:
        """Keep only these heads' share of any per-head parameters (after head pruning)."""

    @property
    def max_positions(self) -> int | None:
        """How many positions the scheme can encode; None when there is no limit."""
        return None


def sinusoid(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """The paper's table: PE(pos, 2i) = sin(pos / n^(2i/D)), PE(pos, 2i+1) = cos(pos / n^(2i/D)).

    (T,) positions -> (T, dim), computed in float32 for any position (no maximum length).
    """
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)  # (D/2,)
    angles = positions.float()[:, None] * inv_freq[None, :]  # (T, D/2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (T, D): sin, cos interleaved


class AbsolutePositional(PositionalEncoding):
    """A vector per position, added to the token vectors or concatenated with them."""

    absolute = True

    def __init__(self, combine: str = "add") -> None:
        super().__init__()
        self.concat = {"add": False, "concat": True}[combine]

    def encode(self, positions: Tensor) -> Tensor:
        """(T,) positions -> (T, D_pos) vectors."""
        raise NotImplementedError

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        pe = self.encode(positions).to(tokens.dtype)  # (T, D_pos)
        if self.concat:
            return torch.cat([tokens, pe.expand(tokens.shape[0], -1, -1)], dim=-1)  # (B, T, D_tok + D_pos)
        return tokens + pe  # (B, T, d_model)


class SinusoidalPositional(AbsolutePositional):
    """Fixed sinusoids (Vaswani et al. 2017) with a configurable base n (default 10000)."""

    def __init__(self, dim: int, base: float = 10000.0, combine: str = "add") -> None:
        super().__init__(combine)
        self.dim, self.base = dim, base

    @classmethod
    def from_config(cls, cfg: Any) -> "SinusoidalPositional":
        return cls(cfg.positions.width(cfg.stack.d_model), cfg.positions.base, cfg.positions.combine)

    def encode(self, positions: Tensor) -> Tensor:
        return sinusoid(positions, self.dim, self.base)


class HalvesSinusoidalPositional(SinusoidalPositional):
    """The same sinusoids laid out as Marian (and tensor2tensor) lay them: every sine, then every
    cosine, PE(pos, i) = sin(pos / n^(2i/D)) and PE(pos, D/2 + i) = cos(pos / n^(2i/D)), i < D/2."""

    def encode(self, positions: Tensor) -> Tensor:
        table = sinusoid(positions, self.dim, self.base)  # (T, D): sin, cos interleaved
        return torch.cat([table[:, 0::2], table[:, 1::2]], dim=-1)  # (T, D): sines, then cosines


class WhisperSinusoidalPositional(SinusoidalPositional):
    """Whisper's fixed table (Radford et al. 2022), the halves layout with its timescales spread so
    that the slowest is exactly n: PE(pos, i) = sin(pos / n^(i / (D/2 - 1))) and PE(pos, D/2 + i) =
    cos(pos / n^(i / (D/2 - 1))), i < D/2 (Marian's exponent is 2i / D). The frames encoder's
    (models/whisper_encoder.py); D even, at least 4."""

    def encode(self, positions: Tensor) -> Tensor:
        half = self.dim // 2
        rate = math.log(self.base) / (half - 1)  # the log-timescale step
        inv_timescales = torch.exp(-rate * torch.arange(half, dtype=torch.float32, device=positions.device))  # (D/2,)
        angles = positions.float()[:, None] * inv_timescales[None, :]  # (T, D/2)
        return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (T, D): sines, then cosines


class LearnedPositional(AbsolutePositional):
    """A learned vector per position up to max_len (Gehring et al. 2017; BERT, GPT)."""

    def __init__(self, dim: int, max_len: int, combine: str = "add") -> None:
        super().__init__(combine)
        self.table = nn.Embedding(max_len, dim)

    @classmethod
    def from_config(cls, cfg: Any) -> "LearnedPositional":
        return cls(cfg.positions.width(cfg.stack.d_model), cfg.positions.max_len, cfg.positions.combine)

    @property
    def max_positions(self) -> int:
        return self.table.num_embeddings

    def encode(self, positions: Tensor) -> Tensor:
        """The models check positions against ``max_positions`` before they get here (Embeddings.positions)."""
        return self.table(positions)


def clipped_offsets(q_pos: Tensor, k_pos: Tensor, max_distance: int) -> Tensor:
    """(Tq,), (Tk,) -> (Tq, Tk) table indices of clip(j - i, -k, k) + k, in [0, 2k]."""
    return (k_pos[None, :] - q_pos[:, None]).clamp(-max_distance, max_distance) + max_distance


class RelativePositional(PositionalEncoding):
    """Shaw et al. (2018): learned key and value vectors for each clipped offset j - i.

    e_ij = q_i . (k_j + a^K_ij) / sqrt(Dh),   z_i = sum_j alpha_ij (v_j + a^V_ij),
    with a_ij = w_clip(j - i, k), shared by all heads of a layer.
    """

    def __init__(self, d_head: int, max_distance: int) -> None:
        super().__init__()
        self.max_distance = max_distance
        self.scale = math.sqrt(d_head)
        self.key_table = nn.Embedding(2 * max_distance + 1, d_head)
        self.value_table = nn.Embedding(2 * max_distance + 1, d_head)

    @classmethod
    def from_config(cls, cfg: Any) -> "RelativePositional":
        return cls(cfg.stack.d_head, cfg.positions.max_relative_distance)

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        # q . a^K for each of the 2k+1 offsets, then picked per (i, j): O(T (2k+1) Dh), not O(T^2 Dh)
        per_offset = q @ self.key_table.weight.to(q.dtype).T / self.scale  # (B, H, Tq, 2k+1)
        index = clipped_offsets(q_pos, k_pos, self.max_distance).expand(*q.shape[:2], -1, -1)  # (B, H, Tq, Tk)
        return per_offset.gather(-1, index)  # (B, H, Tq, Tk)

    def value_term(self, probs: Tensor | None, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        probs = cast(Tensor, probs)  # formed: this scheme needs_probs
        # sum_j alpha_ij a^V_{j-i}: add up the weights falling on each clipped offset, then mix the table
        index = clipped_offsets(q_pos, k_pos, self.max_distance).expand_as(probs)  # (B, H, Tq, Tk)
        per_offset = probs.new_zeros(*probs.shape[:-1], self.value_table.num_embeddings)  # (B, H, Tq, 2k+1)
        per_offset.scatter_add_(-1, index, probs)
        return per_offset @ self.value_table.weight.to(probs.dtype)  # (B, H, Tq, Dh)

    biases_scores = True

    @property
    def needs_probs(self) -> bool:
        return True


class RelativeBias(PositionalEncoding):
    """A learned scalar per head and clipped offset j - i, added to the scores (T5-style, clipped
    rather than log-bucketed)."""

    biases_scores = True

    def __init__(self, n_heads: int, max_distance: int) -> None:
        super().__init__()
        self.max_distance = max_distance
        self.table = nn.Embedding(2 * max_distance + 1, n_heads)

    @classmethod
    def from_config(cls, cfg: Any) -> "RelativeBias":
        return cls(cfg.stack.n_heads, cfg.positions.max_relative_distance)

    def keep_heads(self, keep: Tensor) -> None:
        table = nn.Embedding(self.table.num_embeddings, len(keep)).to(self.table.weight.device)
        table.weight = nn.Parameter(self.table.weight.detach()[:, keep].clone())
        self.table = table

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        bias = self.table(clipped_offsets(q_pos, k_pos, self.max_distance))  # (Tq, Tk, H)
        return bias.permute(2, 0, 1).unsqueeze(0).to(q.dtype)  # (1, H, Tq, Tk)


class RotaryPositional(PositionalEncoding):
    """RoPE (Su et al. 2021): rotate each pair (x_2i, x_2i+1) of queries and keys by pos * theta_i,
    theta_i = n^(-2i/Dh). Then q_m . k_n depends on the positions only through m - n."""

    def __init__(self, d_head: int, base: float = 10000.0) -> None:
        super().__init__()
        self.d_head, self.base = d_head, base

    @classmethod
    def from_config(cls, cfg: Any) -> "RotaryPositional":
        return cls(cfg.stack.d_head, cfg.positions.base)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        # angles in float32 whatever the model's dtype: bf16 would lose whole radians at long positions
        inv_freq = self.base ** (-torch.arange(0, self.d_head, 2, dtype=torch.float32, device=x.device) / self.d_head)
        angles = positions.float()[:, None] * inv_freq[None, :]  # (T, Dh/2)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        even, odd = torch.unflatten(x, -1, (-1, 2)).unbind(-1)  # (B, H, T, Dh/2) each
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def alibi_slopes(n_heads: int) -> Tensor:
    """Press et al. (2022): the geometric sequence 2^(-8/n), 2^(-16/n), ... for n a power of two;
    otherwise the slopes of the nearest lower power of two, then every other slope of the next."""

    def powers(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    lower = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = powers(lower) + powers(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(slopes)


class ALiBiPositional(PositionalEncoding):
    """ALiBi: no position vectors; score_ij gets -m_h |i - j|, a per-head linear distance penalty."""

    biases_scores = True
    slopes: Tensor  # (H,), a buffer

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    @classmethod
    def from_config(cls, cfg: Any) -> "ALiBiPositional":
        return cls(cfg.stack.n_heads)

    def keep_heads(self, keep: Tensor) -> None:
        self.slopes = self.slopes[keep.to(self.slopes.device)]

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        distance = (k_pos[None, :] - q_pos[:, None]).abs().to(q.dtype)  # (Tq, Tk)
        return -self.slopes.to(q.dtype)[None, :, None, None] * distance  # (1, H, Tq, Tk)
