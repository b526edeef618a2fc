"""Label-smoothed cross-entropy (Szegedy et al. 2016; the paper's epsilon_ls = 0.1).

The target distribution puts 1 - eps on the reference token and spreads eps uniformly over the
whole vocabulary: q = (1 - eps) onehot(y) + eps / V. Its cross-entropy with the model's p is

    loss = (1 - eps) * (-log p_y) + eps * mean_k(-log p_k)
         = lse(x) - (1 - eps) * x_y - eps * mean_k(x_k),      lse(x) = log sum_k exp(x_k),

which is what ``F.cross_entropy(..., label_smoothing=eps)`` computes. Padding positions count for
nothing. The plain NLL (lse(x) - x_y) is returned too: perplexity is exp(NLL per token), never of
the smoothed loss.

The computation is fused: rows are taken a chunk at a time, cast to float32 there (the loss is
float32 even under bf16 autocast), and only lse(x) per row is kept for the backward, which writes
d loss / d x = softmax(x) - (1 - eps) onehot(y) - eps / V straight into the logits' dtype. The
(N, V) float32 log-probabilities that the textbook form materialises (twice, with its backward)
never exist. tests/test_train.py checks it against that form.

A chunk is about 2 MB of float32 values (65 rows of an 8,000-word vocabulary), which stay in the
core's cache between the passes over them: on 1,536 x 8,000 bf16 logits, forward + backward takes
32.6 ms with 64-row chunks against 60.2 ms with 1,024-row ones (docs/performance/cpu.md). A small
vocabulary gets long chunks, so that the rows do not cost a Python loop each.

That is the CPU's loss, in eager mode. On a GPU, and wherever torch.compile traces it, the loss is
the same formula written as tensor expressions (:func:`smoothed_nll_expression`): TorchInductor
fuses the cast, the log-sum-exp, the target's logit (a masked sum: :func:`target_logits`) and the
mean into one pass over the bf16 logits, and their backward into another, so no float32 (N, V)
tensor exists there either. On an H100 the chunked function took 14.96 ms (forward + backward,
8,192 x 50,304 bf16 logits) against 7.86 ms for F.cross_entropy(logits.float()) and 2.02 ms for the
same compiled (docs/performance/gpu_training.md; before the masked sum); in eager mode on a GPU the expression
costs what F.cross_entropy does.
"""

from __future__ import annotations

from typing import Callable, Protocol, cast

import torch
from torch import Tensor

CHUNK_ELEMENTS = 1 << 19  # float32 values per chunk on the CPU (2 MB)


def chunk_rows(logits: Tensor) -> int:
    """Rows of (N, V) ``logits`` taken at a time."""
    return max(1, CHUNK_ELEMENTS // logits.shape[1])


class _NLLContext(Protocol):
    """What the function's ``ctx`` carries from its forward to its backward."""

    epsilon: float
    saved_tensors: tuple[Tensor, ...]

    def save_for_backward(self, *tensors: Tensor) -> None: ...


class _LabelSmoothedNLL(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: _NLLContext, logits: Tensor, target: Tensor, epsilon: float, ignore_index: int
    ) -> tuple[Tensor, Tensor]:
        real = target != ignore_index  # (N,)
        safe = target.masked_fill(~real, 0)
        weight = real.to(torch.float32)  # (N,): 1 for real tokens, 0 for padding
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        loss = logits.new_zeros((), dtype=torch.float32)
        nll = logits.new_zeros((), dtype=torch.float32)
        n = chunk_rows(logits)
        for start in range(0, logits.shape[0], n):
            rows = slice(start, start + n)
            x = logits[rows].float()  # (n, V)
            lse[rows] = torch.logsumexp(x, dim=-1)
            picked = x.gather(-1, safe[rows, None]).squeeze(-1)
            nll_rows = (lse[rows] - picked) * weight[rows]
            nll_chunk = nll_rows.sum()
            nll += nll_chunk
            if epsilon > 0.0:  # the uniform term is one more pass over the chunk: only when it counts
                uniform_rows = (lse[rows] - x.mean(-1)) * weight[rows]
                loss += ((1.0 - epsilon) * nll_rows + epsilon * uniform_rows).sum()
            else:
                loss += nll_chunk
        ctx.save_for_backward(logits, safe, weight, lse)
        ctx.epsilon = epsilon
        return loss, nll

    @staticmethod
    def backward(ctx: _NLLContext, g_loss: Tensor, g_nll: Tensor) -> tuple[Tensor, None, None, None]:
        logits, safe, weight, lse = ctx.saved_tensors
        eps, V = ctx.epsilon, logits.shape[-1]
        grad = torch.empty_like(logits)
        # d/dx of g_loss * loss + g_nll * nll = (g_loss + g_nll) softmax - (g_loss (1 - eps) + g_nll) onehot - g_loss eps / V
        onehot_weight = g_loss * (1.0 - eps) + g_nll
        weight = weight[:, None]  # (N, 1)
        n = chunk_rows(logits)
        for start in range(0, logits.shape[0], n):
            rows = slice(start, start + n)
            inplace = grad[rows] if grad.dtype == torch.float32 else None  # float32: work in the gradient itself
            g = torch.sub(logits[rows].float(), lse[rows, None], out=inplace).exp_()
            g.mul_(g_loss + g_nll).sub_(g_loss * eps / V)
            g.scatter_add_(-1, safe[rows, None], (-onehot_weight).expand(g.shape[0], 1))
            g.mul_(weight[rows])
            if inplace is None:
                grad[rows] = g
        return grad, None, None, None


def target_logits(x: Tensor, target: Tensor) -> Tensor:
    """(N, V) ``x``, (N,) ``target`` -> (N,) x[n, target[n]]. Traced by torch.compile, a masked sum
    over each row: Inductor fuses it into the row's other reductions, and its gradient is a select,
    where gather's is a scatter_add into a zeroed float32 (N, V) buffer that the next kernel reads
    back (twice the loss backward's traffic). Eager, a gather: no (N, V) temporary."""
    if torch.compiler.is_compiling():
        return torch.where(torch.arange(x.shape[-1], device=x.device) == target[:, None], x, 0.0).sum(-1)
    return x.gather(-1, target[:, None]).squeeze(-1)


def smoothed_nll_expression(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int) -> tuple[Tensor, Tensor]:
    """The same loss as tensor expressions, for autograd and TorchInductor: (N, V) ``logits``, (N,)
    ``target`` -> (loss, NLL) sums, float32."""
    real = target != ignore_index  # (N,)
    x = logits.float()  # (N, V); compiled, a cast inside the fused reductions, never stored
    lse = torch.logsumexp(x, dim=-1)  # (N,)
    picked = target_logits(x, target.masked_fill(~real, 0))  # (N,): x_y
    nll = torch.where(real, lse - picked, 0.0)  # (N,)
    total = nll.sum()
    if epsilon == 0.0:
        return total, total
    uniform = torch.where(real, lse - x.mean(-1), 0.0)  # (N,): mean_k(-log p_k)
    return ((1.0 - epsilon) * nll + epsilon * uniform).sum(), total


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int) -> tuple[Tensor, Tensor]:
    """logits (..., V), target (...) -> (smoothed loss summed over real tokens, NLL summed likewise),
    both float32: the chunked function on a CPU in eager mode, the expression elsewhere."""
    logits, target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    if logits.device.type == "cpu" and not torch.compiler.is_compiling():
        # Function.apply is untyped in PyTorch: it returns what forward returns
        apply = cast(Callable[[Tensor, Tensor, float, int], tuple[Tensor, Tensor]], _LabelSmoothedNLL.apply)
        return apply(logits, target, epsilon, ignore_index)
    return smoothed_nll_expression(logits, target, epsilon, ignore_index)
