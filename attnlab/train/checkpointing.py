"""When ``fit`` (train/loop.py) writes a checkpoint: after an evaluation, with the task's scores, marked
best or counted by early stopping (:class:`Evaluations`); once train.checkpoint_minutes pass without
one (:class:`Autosave`); and at the first Ctrl-C, of the update in flight (:class:`CtrlC`)."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from attnlab.runs.run_dir import RunDir
from attnlab.runs.train_config import TrainConfig
from attnlab.tasks import Task, TaskData
from attnlab.train.progress import Health, Progress, TrainLog
from attnlab.train.strategy import Strategy


class Evaluations:
    """An evaluation: the task's scores on the validation split (train.eval_exact_match: how many
    examples to predict for the metrics that need predictions), logged, and a checkpoint (rank 0
    writes) of the model and ``trainer_state()`` (a function: the state as it is when written),
    marked best when early_stop_metric improved (lower or higher as the task says); early stopping
    counts the evaluations without a gain. ``scores``: the newest; ``step``: the step of the newest
    checkpoint, written or resumed from (None before the first)."""

    def __init__(
        self,
        task: Task[Any, Any],
        data: TaskData,
        cfg: TrainConfig,
        device: torch.device,
        amp: Callable[[], ContextManager[Any]],
        train_log: TrainLog,
        run: RunDir,
        strategy: Strategy,
        trainer_state: Callable[[], dict[str, Any]],
        resumed_at: int | None,
    ) -> None:
        self.task, self.data, self.cfg, self.device, self.amp = task, data, cfg, device, amp
        self.train_log, self.run, self.strategy, self.trainer_state = train_log, run, strategy, trainer_state
        self.main = strategy.world is None or strategy.world.is_main
        self.metric, self.lower_is_better = cfg.early_stop_metric, task.metrics[cfg.early_stop_metric]
        self.step = resumed_at
        # a resumed run that is done already reports its last scores
        self.scores = run.metrics_at(resumed_at) if resumed_at is not None else {}

    def __call__(self, progress: Progress, model: nn.Module) -> None:
        """Every rank calls this: a split model's weights and optimizer state are gathered for rank 0."""
        self.strategy.assemble(model)  # a pipeline's stages, whole on every rank
        self.scores = self.task.validate(model, self.data, self.device, self.amp, self.cfg.eval_exact_match)
        self.train_log.valid(progress.step, self.scores)
        value = self.scores[self.metric]
        improved = progress.best is None or (value < progress.best if self.lower_is_better else value > progress.best)
        if improved:
            progress.best, progress.bad_evals = value, 0
        else:
            progress.bad_evals += 1
        self._save(progress, model, {"metrics": self.scores}, best=(self.metric, value) if improved else None)

    def checkpoint_only(self, progress: Progress, model: nn.Module, why: str) -> None:
        """A checkpoint of this step with no scores, unless it has one; ``why`` (interrupted: Ctrl-C;
        periodic: :class:`Autosave`) is true in its meta.json. It resumes like any other and is never
        marked best; early stopping does not count it."""
        if self.step != progress.step:
            self.strategy.assemble(model)
            self._save(progress, model, {"metrics": {}, why: True})

    def _save(
        self, progress: Progress, model: nn.Module, meta: dict[str, Any], best: tuple[str, float] | None = None
    ) -> None:
        weights, state = self.strategy.weights(model), self.trainer_state()
        if self.main:
            self.run.save(progress.step, weights, state, meta, self.cfg.keep_last, best=best)
        self.step = progress.step


class Autosave:
    """A checkpoint once train.checkpoint_minutes of the wall clock pass without one (evaluated or
    not), so that a kill, a crash or a SIGTERM loses at most that much however rare evaluations are.
    Under torchrun every rank writes its share together: the time that decides is the longest any
    rank has seen (agreed in the step's one all-reduce, with its seconds)."""

    def __init__(self, cfg: TrainConfig, evaluations: Evaluations, now: float) -> None:
        self.every, self.evaluations = cfg.checkpoint_minutes * 60, evaluations
        self.since, self.at = now, evaluations.step

    def waited(self, now: float) -> float:
        """Seconds since the last checkpoint, on this rank's clock."""
        return now - self.since

    def __call__(self, progress: Progress, model: nn.Module, health: Health, now: float, waited: float) -> None:
        """After an update: ``waited``, the longest :meth:`waited` of the ranks when the update ended."""
        if self.evaluations.step != self.at:  # an evaluation wrote one: the time counts from it
            self.since, self.at = now, self.evaluations.step
        elif waited >= self.every:
            health.look(progress)  # a checkpoint keeps numbers
            self.evaluations.checkpoint_only(progress, model, "periodic")
            self.since, self.at = now, self.evaluations.step


class CtrlC:
    """Ctrl-C while one process trains: the first stops the run at the end of the update in flight,
    where the loop writes a checkpoint of that step (not evaluated) and raises KeyboardInterrupt, so
    nothing since the last evaluation is lost; a second Ctrl-C interrupts at once. Where Python does
    not raise KeyboardInterrupt for SIGINT (a background job ignores it; another handler is set),
    off the main thread, and under torchrun (where the ranks would stop at different steps), Ctrl-C
    keeps its own behaviour."""

    previous: Callable[[int, FrameType | None], Any] | int | None  # the SIGINT handler before this one

    def __init__(self, active: bool) -> None:
        self.active, self.requested, self.previous = active, False, None

    def __enter__(self) -> "CtrlC":
        if (
            self.active
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self.previous = signal.signal(signal.SIGINT, self._request)
        return self

    def _request(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self.previous)  # a second Ctrl-C: KeyboardInterrupt at once

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
