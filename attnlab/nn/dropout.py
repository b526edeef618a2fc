"""Dropout with cheap random masks.

``torch.nn.functional.dropout`` on the CPU draws one random number per element through a
Bernoulli sampler; on this machine that costs as much as a matrix product of the same size
(docs/performance/cpu.md). Here one 64-bit draw gives four 16-bit random integers, and an element is
kept when its integer is at least round(p * 65536): the drop rate is p to within 1/65536, the
kept values are scaled by 65536 / (65536 - threshold) so that the expectation is unchanged, and
the mask is kept as booleans (one byte per element) for the backward. Dropped elements are zeroed
with ``masked_fill``: multiplying a float32 tensor by a boolean one first converts the booleans,
which made that product 3.4x slower (docs/performance/cpu.md). The draws come from the
default generator, so ``torch.manual_seed``, checkpointed RNG states and activation
checkpointing's RNG replay all work as with ``F.dropout``.

All this is the CPU's remedy. On a GPU, ``F.dropout`` is one fused kernel, so :func:`dropout` hands
it every CUDA tensor (the CPU's figures keep their draws, and the meta device of the memory budget,
analysis/budget.py, counts the CPU's boolean masks).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LEVELS = 1 << 16


def drop_mask(shape: torch.Size, p: float, device: torch.device) -> tuple[Tensor, float]:
    """A boolean mask, True for the elements to drop (each with probability p, to 1/65536), and
    the scale of the kept ones."""
    threshold = round(p * LEVELS)
    n = shape.numel()
    # torch.randint draws what empty().random_() drew, but out of place: TorchDynamo breaks its graph at random_
    draws = torch.randint(-(1 << 63), (1 << 63) - 1, ((n + 3) // 4,), dtype=torch.int64, device=device)
    levels = draws.view(torch.int16)[:n].view(shape)  # uniform over [-32768, 32767]
    return levels < threshold - LEVELS // 2, LEVELS / (LEVELS - threshold)


class _Dropout(torch.autograd.Function):
    apply: ClassVar[Callable[[Tensor, float], Tensor]]  # (x, p) -> x dropped; torch leaves Function.apply untyped

    @staticmethod
    def forward(ctx: Any, x: Tensor, p: float) -> Tensor:
        drop, scale = drop_mask(x.shape, p, x.device)
        ctx.save_for_backward(drop)
        ctx.scale = scale
        return x.masked_fill(drop, 0.0).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (drop,) = ctx.saved_tensors
        return grad.masked_fill(drop, 0.0).mul_(ctx.scale), None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1 / (1 - p), when training."""
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1) (got {p})")
    if x.is_cuda:  # a GPU's fused kernel (module docstring)
        return F.dropout(x, p, training=True)
    return _Dropout.apply(x, p)


class Dropout(nn.Module):
    """Drop-in for ``nn.Dropout`` with the cheap masks above; ``p`` may be changed at any time."""

    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
