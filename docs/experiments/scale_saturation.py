"""Dividing the scores by sqrt(d_k): what happens to softmax attention without it (docs/claims/sqrt_dk.md).

The paper (section 3.2.1 and its footnote 4) argues that for q, k with independent unit-variance
components, q . k has variance d_k, so for large d_k the softmax is pushed to regions with tiny
gradients. This measures that on random inputs, with attnlab's own pieces: the queries go through
``PaperScale`` (scores q . k / sqrt(d_k)) or ``NoScale`` (scores q . k) from nn/scores.py, the scores
are ``scaled_dot`` (nn/scores.py, the backends' division by sqrt(d_k)), and the softmax and weighted
sum are ``attend`` from nn/scores.py, the reference backend's.

Per d_k: B = 32 sequences of T = 64 queries and 64 keys, q, k, v entries i.i.d. N(0, 1), float32,
generator seeded with d_k. Reported, over all B x T query rows:

- Var(q . k): the variance of the unscaled dot products (expected d_k), and of the scaled ones (1);
- the mean largest attention weight of a row (uniform: 1/64 = 0.016) and the mean entropy of a row
  in nats (uniform: log 64 = 4.159);
- the norm of a row's gradient dL/ds with respect to its scores s, for the loss L = sum over rows
  of softmax(s) v (one random value v_j per key, the same for both scalings, so dL/d(weight_j) = v_j
  whatever d_k): its mean and its median over the rows, and the ratios unscaled / scaled.

    .venv/bin/python docs/experiments/scale_saturation.py
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnlab.nn.scores import NoScale, PaperScale, attend, scaled_dot

SEQ_LEN = 64
BATCH = 32
D_KS = (16, 64, 256, 1024)


def inputs(d_k: int, batch: int = BATCH, seq_len: int = SEQ_LEN, seed: int | None = None) -> tuple:
    """q, k (batch, T, d_k) and one value per key v (batch, T, 1), i.i.d. N(0, 1), seeded."""
    gen = torch.Generator().manual_seed(d_k if seed is None else seed)
    q, k = (torch.randn(batch, seq_len, d_k, generator=gen) for _ in range(2))
    return q, k, torch.randn(batch, seq_len, 1, generator=gen)


def saturation(q, k, v, scale: nn.Module) -> dict[str, float]:
    """One scaling: the scores' variance, the mean max weight and entropy of a row, and the mean and
    median norm of a row's gradient dL/ds, L = sum over rows of softmax(s) v."""
    scores = scaled_dot(scale(q), k).detach().requires_grad_(True)  # (B, T, T), what the backend computes
    out, probs = attend(scores, v)  # out (B, T, 1): each row's weighted mean of v
    out.sum().backward()
    probs = probs.detach()
    entropy = -(probs * probs.clamp_min(1e-45).log()).sum(-1)  # 0 log 0 = 0
    grad = scores.grad.norm(dim=-1)  # (B, T), one norm per query row
    return {
        "var": scores.detach().var().item(),
        "max_p": probs.amax(-1).mean().item(),
        "entropy": entropy.mean().item(),
        "grad": grad.mean().item(),
        "grad_median": grad.median().item(),
    }


def measure(d_k: int, batch: int = BATCH, seq_len: int = SEQ_LEN, seed: int | None = None) -> dict[str, dict]:
    q, k, v = inputs(d_k, batch, seq_len, seed)
    return {"scaled": saturation(q, k, v, PaperScale(d_k)), "unscaled": saturation(q, k, v, NoScale(d_k))}


def table(d_ks=D_KS) -> str:
    rows = [
        "| d_k | Var(q.k) | Var(q.k/sqrt(d_k)) | max weight: scaled / unscaled "
        "| entropy (nats): scaled / unscaled | mean grad norm: scaled / unscaled (ratio) "
        "| median grad norm: scaled / unscaled (ratio) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for d_k in d_ks:
        m = measure(d_k)
        s, u = m["scaled"], m["unscaled"]
        rows.append(
            f"| {d_k} | {u['var']:.1f} | {s['var']:.3f} | {s['max_p']:.3f} / {u['max_p']:.3f} "
            f"| {s['entropy']:.3f} / {u['entropy']:.3f} "
            f"| {s['grad']:.3f} / {u['grad']:.3f} ({u['grad'] / s['grad']:.2f}) "
            f"| {s['grad_median']:.3f} / {u['grad_median']:.2e} ({u['grad_median'] / s['grad_median']:.1e}) |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(
        f"T = {SEQ_LEN} keys per query, {BATCH} x {SEQ_LEN} query rows per d_k; "
        f"uniform: max weight {1 / SEQ_LEN:.3f}, entropy {math.log(SEQ_LEN):.3f} nats\n"
    )
    print(table())
