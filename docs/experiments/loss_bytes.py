"""What the compiled loss moves: TorchInductor's own count of the bytes its kernels read and write
(torch._inductor.metrics.num_bytes_accessed) for the forward and backward of the training loss on
256 x 50,304 bf16 logits (gpt2-small's padded vocabulary, the 50,257 real columns sliced as the
model's head does), on the CPU: the target's logit picked as attnlab picks it when traced (a masked
sum, nn/losses.py's ``target_logits``), by a gather (the form before), and the loss through
F.cross_entropy (the reference's). Inductor's CPU code is not a GPU's, but its fusion and its
buffers are the same decisions, so the bytes are a proxy for a GPU's memory traffic.
    OMP_NUM_THREADS=1 .venv/bin/python docs/experiments/loss_bytes.py
"""

from __future__ import annotations

import logging

import torch
import torch._inductor.config as inductor
import torch._inductor.metrics as metrics
import torch.nn.functional as F

from attnlab.nn import losses

N, V, PADDED, EPS, PAD = 256, 50257, 50304, 0.0, 0  # gpt2-small's shape: no label smoothing


def gathered(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return x.gather(-1, target[:, None]).squeeze(-1)


def cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, eps: float, pad: int
) -> tuple[torch.Tensor, torch.Tensor]:
    nll = F.cross_entropy(logits.float(), target, ignore_index=pad, label_smoothing=eps, reduction="sum")
    return nll, nll


def traffic(loss, logits: torch.Tensor, target: torch.Tensor) -> tuple[int, int, torch.Tensor]:
    torch._dynamo.reset()
    metrics.reset()
    x = logits.clone().requires_grad_()
    total, nll = torch.compile(lambda t: loss(t[:, :V], target, EPS, PAD))(x)
    (total + 0.5 * nll).backward()
    return metrics.generated_kernel_count, metrics.num_bytes_accessed, x.grad


def main() -> None:
    inductor.fx_graph_cache = False
    torch._logging.set_logs(inductor_metrics=True)  # Inductor counts the bytes only with this log on
    logging.getLogger("torch._inductor").setLevel(logging.WARNING)  # counted, not printed
    g = torch.Generator().manual_seed(0)
    target = torch.randint(1, V, (N,), generator=g)
    target[::7] = PAD
    logits = torch.randn(N, PADDED, generator=g).to(torch.bfloat16)
    kernels, moved, grad = traffic(losses.smoothed_nll_expression, logits, target)
    print(f"masked sum (attnlab)  {kernels:2d} kernels {moved / 1e6:7.1f} MB")
    masked_sum = losses.target_logits
    losses.target_logits = gathered
    kernels, moved, gather_grad = traffic(losses.smoothed_nll_expression, logits, target)
    losses.target_logits = masked_sum
    print(
        f"gather (before)       {kernels:2d} kernels {moved / 1e6:7.1f} MB   same gradient: {torch.equal(grad, gather_grad)}"
    )
    kernels, moved, _ = traffic(cross_entropy, logits, target)
    print(f"F.cross_entropy       {kernels:2d} kernels {moved / 1e6:7.1f} MB")


if __name__ == "__main__":
    main()
