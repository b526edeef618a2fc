"""Label-smoothed cross-entropy (Szegedy et al. 2016; the paper's epsilon_ls = 0.1).

The target distribution puts 1 - eps on the reference token and spreads eps uniformly over the
whole vocabulary: q = (1 - eps) onehot(y) + eps / V. Its cross-entropy with the model's p is

    loss = (1 - eps) * (-log p_y) + eps * mean_k(-log p_k),

which is what ``F.cross_entropy(..., label_smoothing=eps)`` computes. Padding positions count for
nothing. The plain NLL is returned too: perplexity is exp(NLL per token), never of the smoothed loss.
"""

from __future__ import annotations

from torch import Tensor


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int) -> tuple[Tensor, Tensor]:
    """logits (..., V), target (...) -> (smoothed loss summed over real tokens, NLL summed likewise)."""
    lprobs = logits.float().log_softmax(dim=-1)  # (..., V), in float32 even under autocast
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (...)
    uniform = -lprobs.mean(dim=-1)  # (...)
    real = target != ignore_index
    nll = nll.masked_fill(~real, 0.0).sum()
    uniform = uniform.masked_fill(~real, 0.0).sum()
    return (1.0 - epsilon) * nll + epsilon * uniform, nll
