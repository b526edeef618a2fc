"""Learning-rate schedules, as functions of the 1-based index of the optimizer update.

noam (the paper):  lr(k) = factor * d_model^-0.5 * min(k^-0.5, k * warmup^-1.5)
cosine:            linear warm-up to lr over `warmup` updates, then half a cosine down to min_lr at `total`
constant:          linear warm-up to lr, then lr

A warm-up as long as the run would never reach its peak (the paper's 4,000 warm-up steps in a
200-step run peak at 5% of it): :func:`fitted_warmup` then squeezes the schedule in time so that
the warm-up takes a tenth of the run and the peak stays the same.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from attnlab.runs.train_config import TrainConfig

Schedule = Callable[[int], float]


def noam(factor: float, d_model: int, warmup: int) -> Schedule:
    return lambda k: factor * d_model**-0.5 * min(k**-0.5, k * warmup**-1.5)


def cosine(peak: float, warmup: int, total: int, floor: float = 0.0) -> Schedule:
    def lr(k: int) -> float:
        if k <= warmup:
            return peak * k / warmup
        progress = min(1.0, (k - warmup) / max(1, total - warmup))
        return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))

    return lr


def constant(peak: float, warmup: int) -> Schedule:
    return lambda k: peak * min(1.0, k / warmup) if warmup else peak


def fitted_warmup(name: str, lr: float, warmup: int, total: int) -> tuple[float, int, str]:
    """The (lr, warmup) a schedule of ``total`` updates uses, and a note if they were changed.

    Unchanged unless ``warmup >= total``; then the warm-up becomes ``total // 10`` (at least 1).
    cosine and constant keep lr, their peak; noam's peak is factor * d^-0.5 * warmup^-0.5, so its
    factor is scaled by sqrt(new / old) to keep it: noam(factor', d, w')(k) = noam(factor, d, w)(k w / w'),
    the same curve played w / w' times faster."""
    if warmup < total:
        return lr, warmup, ""
    fitted = max(1, total // 10)
    if name == "noam":
        lr = lr * math.sqrt(fitted / warmup)
    return (
        lr,
        fitted,
        (
            f"note: train.warmup_steps ({warmup}) is not shorter than the run (max_steps {total}): "
            f"warming up over {fitted} step{'s' if fitted > 1 else ''} to the same peak learning rate instead; set "
            f"train.warmup_steps below max_steps to choose"
        ),
    )


def make_schedule(name: str, lr: float, warmup: int, total: int, min_lr: float, d_model: int | None) -> Schedule:
    if name == "noam":
        assert d_model is not None, "the run config refuses noam for a family without a stack (runs/config.py)"
        return noam(lr, d_model, warmup)
    if name == "cosine":
        return cosine(lr, warmup, total, min_lr)
    return constant(lr, warmup)


def run_schedule(cfg: TrainConfig, d_model: int | None) -> tuple[Schedule, str]:
    """The schedule of a run's train section, its warm-up fitted to the run (:func:`fitted_warmup`),
    and the note that says so where it was; ``d_model``: the model's width, for noam."""
    lr, warmup, note = fitted_warmup(cfg.lr_schedule, cfg.lr, cfg.warmup, cfg.max_steps)
    return make_schedule(cfg.lr_schedule, lr, warmup, cfg.max_steps, cfg.min_lr, d_model), note


def make_scheduler(optimizer: torch.optim.Optimizer, schedule: Schedule) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR that sets the lr of update k to schedule(k), times the group's ``lr_scale`` where it
    has one (layer-wise decay): the optimizer's base lr is set to 1 and LambdaLR counts completed
    updates from 0."""
    for group in optimizer.param_groups:
        group["lr"] = 1.0
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, [_scaled(schedule, group.get("lr_scale", 1.0)) for group in optimizer.param_groups]
    )


def _scaled(schedule: Schedule, scale: float) -> Callable[[int], float]:
    """LambdaLR's factor of update ``done`` (from 0): the schedule's lr of update ``done`` + 1, times a
    parameter group's ``scale``. A function, which LambdaLR leaves out of its state dict (as the lambda
    it replaces), so that checkpoints are unchanged."""
    return lambda done: scale * schedule(done + 1)
