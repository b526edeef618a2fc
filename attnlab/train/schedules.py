"""Learning-rate schedules, as functions of the 1-based index of the optimizer update.

noam (the paper):  lr(k) = factor * d_model^-0.5 * min(k^-0.5, k * warmup^-1.5)
cosine:            linear warm-up to lr over `warmup` updates, then half a cosine down to min_lr at `total`
constant:          linear warm-up to lr, then lr
"""

from __future__ import annotations

import math
from typing import Callable

import torch

Schedule = Callable[[int], float]


def noam(factor: float, d_model: int, warmup: int) -> Schedule:
    return lambda k: factor * d_model ** -0.5 * min(k ** -0.5, k * warmup ** -1.5)


def cosine(peak: float, warmup: int, total: int, floor: float = 0.0) -> Schedule:
    def lr(k: int) -> float:
        if k <= warmup:
            return peak * k / warmup
        progress = min(1.0, (k - warmup) / max(1, total - warmup))
        return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))
    return lr


def constant(peak: float, warmup: int) -> Schedule:
    return lambda k: peak * min(1.0, k / warmup) if warmup else peak


def make_schedule(name: str, lr: float, warmup: int, total: int, min_lr: float, d_model: int) -> Schedule:
    if name == "noam":
        return noam(lr, d_model, warmup)
    if name == "cosine":
        return cosine(lr, warmup, total, min_lr)
    return constant(lr, warmup)


def make_scheduler(optimizer: torch.optim.Optimizer, schedule: Schedule) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR that sets the lr of update k to schedule(k): the optimizer's base lr is set to 1
    and LambdaLR counts completed updates from 0."""
    for group in optimizer.param_groups:
        group["lr"] = 1.0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: schedule(done + 1))
