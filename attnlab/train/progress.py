"""Where training stands and what a run reports of it: ``Progress`` (saved in every checkpoint, so
that a resumed run continues exactly), ``TrainLog`` (metrics.jsonl, TensorBoard, the progress
bar), ``Heartbeat`` (a line at least every minute, whatever the settings) and ``Health`` (the
updates skipped for non-finite numbers, looked at where the loop reads the device anyway).
train/loop.py's ``fit`` drives them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from attnlab.errors import NumericalError
from attnlab.files import atomic_write_text
from attnlab.runs.run_dir import RunDir
from attnlab.runs.train_config import TrainConfig


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint, so that a resumed run continues exactly."""

    step: int = 0
    epoch: int = 0
    batch: int = 0  # batches of `epoch` already consumed
    train_seconds: float = 0.0
    targets: int = 0  # what the task's loss sums over, in all (Task.counts names them: tokens, examples, ...)
    best: float | None = None
    bad_evals: int = 0
    # sums since the last train log line, so that resumed logs match (device tensors between settles)
    window_loss: float | torch.Tensor = 0.0
    window_nll: float | torch.Tensor = 0.0
    window_targets: int = 0
    window_seconds: float = 0.0
    skipped_steps: int = 0  # updates skipped for a non-finite loss or gradient, in all
    bad_in_row: int = 0  # ... and in a row, up to now

    @classmethod
    def saved(cls, state: dict[str, Any]) -> "Progress":
        """The progress a checkpoint saved; one saved before the counts were named targets says tokens."""
        renamed = {"tokens": "targets", "window_tokens": "window_targets"}
        return cls(**{renamed.get(name, name): value for name, value in state.items()})

    def settle(self) -> None:
        """Between two looks, the window's sums and the skip counts are device tensors, added to
        without the host waiting for the device (:func:`_count_step`); read them as numbers (a log
        step, an evaluation: where the loop reads the device anyway)."""
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.item())


class TrainLog:
    """What a run reports: metrics.jsonl and TensorBoard (rank 0 only) and the progress bar. Train
    lines average over the steps since the last one (sums kept in Progress, so a resumed run logs
    what an uninterrupted one would)."""

    def __init__(self, run: RunDir, cfg: TrainConfig, progress: Progress, main: bool, counts: str = "tokens") -> None:
        self.run, self.main = run, main
        self.rate = f"{counts}_per_s"  # throughput in what the task's batches count (Task.counts)
        if main:
            _truncate_metrics(run, progress.step)
        # purge_step drops the events a killed run logged after its last checkpoint
        self.writer = SummaryWriter(str(run.tensorboard), purge_step=progress.step + 1) if main else _NoWriter()
        self.bar = tqdm(
            total=cfg.max_steps,
            initial=progress.step,
            disable=not (cfg.progress and main),
            unit="step",
            dynamic_ncols=True,
            leave=False,
        )

    def _line(self, record: dict[str, Any]) -> None:
        if self.main:
            with open(self.run.metrics, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def train(self, progress: Progress, out: dict[str, Any]) -> None:
        """One train line from the window of steps since the last (settled: numbers, not tensors),
        which it then empties."""
        counted = progress.window_targets or math.nan  # every update of the window skipped: no loss to give
        record = {
            "step": progress.step,
            "split": "train",
            "loss": progress.window_loss / counted,
            "nll": progress.window_nll / counted,
            "lr": out["lr"],
            "grad_norm": float(out["grad_norm"]),
            self.rate: progress.window_targets / progress.window_seconds,
            "epoch": progress.epoch,
            "layer_grad_norms": out["layer_grad_norms"],
        }
        self._line(record)
        for key in ("loss", "nll", "lr", "grad_norm", self.rate):
            self.writer.add_scalar(f"train/{key}", record[key], progress.step)
        for layer, norm in record["layer_grad_norms"].items():
            self.writer.add_scalar(f"grad_norm/{layer}", norm, progress.step)
        self.bar.set_postfix(
            {
                "loss": f"{record['loss']:.3f}",
                "lr": f"{out['lr']:.2e}",
                self.rate.replace("_per_s", "/s"): f"{record[self.rate]:.0f}",
            }
        )
        progress.window_loss = progress.window_nll = progress.window_seconds = 0.0
        progress.window_targets = 0

    def stepped(self) -> None:
        self.bar.update(1)

    def say(self, line: str, log: Callable[[str], None]) -> None:
        """``line`` through ``log``, the progress bar (if shown) cleared around it."""
        with self.bar.external_write_mode():
            log(line)

    def valid(self, step: int, scores: dict[str, float]) -> None:
        for name, value in scores.items():
            self.writer.add_scalar(f"valid/{name}", value, step)
        self._line({"step": step, "split": "valid", **scores})
        if self.main:
            self.bar.write(f"step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in scores.items()))

    def close(self) -> None:
        self.bar.close()
        self.writer.close()


class Heartbeat:
    """A progress line at least every ``every`` seconds of the wall ``clock`` (read once per update by
    the loop), whatever train.progress and log_every say, so that a long run is never silent:
    step/max_steps, the loss since the last train log line, the rate since the last heartbeat and
    the ETA at this session's pace. Rank 0 only; it reads the device, once a minute at most."""

    def __init__(
        self,
        cfg: TrainConfig,
        progress: Progress,
        now: float,
        write: Callable[[str], None],
        counts: str = "tokens",
        every: float = 60.0,
    ) -> None:
        self.max_steps, self.write, self.counts, self.every = cfg.max_steps, write, counts, every
        self.started, self.first_step = now, progress.step  # this session's pace
        self.last, self.last_targets = now, progress.targets

    def __call__(self, progress: Progress, now: float) -> None:
        if now - self.last < self.every:
            return
        progress.settle()
        loss = progress.window_loss / (progress.window_targets or math.nan)
        rate = (progress.targets - self.last_targets) / (now - self.last)
        pace = (now - self.started) / max(progress.step - self.first_step, 1)  # seconds per update
        self.write(
            f"step {progress.step:,}/{self.max_steps:,}: loss {loss:.4g}, {rate:,.0f} {self.counts}/s, "
            f"ETA {duration(pace * (self.max_steps - progress.step))}"
        )
        self.last, self.last_targets = now, progress.targets


def duration(seconds: float) -> str:
    """``seconds`` as a person reads it: 45s, 12m 30s, 3h 05m."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


class _NoWriter:
    """TensorBoard's writer on ranks other than 0: they log nothing."""

    def add_scalar(self, *args: Any) -> None:
        pass

    def close(self) -> None:
        pass


class Health:
    """Updates skipped for a non-finite loss or gradient (train/step.py skips them on the device),
    looked at where the loop reads the device anyway: each look says what was skipped since the
    last, and stops training once ``max_bad_steps`` in a row were."""

    def __init__(
        self, cfg: TrainConfig, precision: str, run: RunDir, log: Callable[[str], None], progress: Progress
    ) -> None:
        self.cfg, self.precision, self.run, self.log = cfg, precision, run, log
        self.seen, self.since = progress.skipped_steps, progress.step

    def look(self, progress: Progress) -> None:
        progress.settle()
        new = progress.skipped_steps - self.seen
        if new:
            self.log(
                f"step {progress.step}: {new} of the updates since step {self.since} had a non-finite loss or "
                f"gradient and were skipped ({progress.bad_in_row} in a row now, {progress.skipped_steps} in all)"
            )
        self.seen, self.since = progress.skipped_steps, progress.step
        if progress.bad_in_row >= self.cfg.max_bad_steps:
            steps = self.run.steps()
            hint = (
                f"the {self.precision} forward pass overflowed: train in precision fp32, or lower lr"
                if self.precision != "fp32"
                else "lower lr, set clip_norm, or lengthen warmup_steps"
            )
            raise NumericalError(
                f"training stopped at step {progress.step}: the last {progress.bad_in_row} updates "
                f"in a row had a non-finite loss or gradient (train.max_bad_steps = "
                f"{self.cfg.max_bad_steps}); {hint}. The newest checkpoint is step "
                f"{steps[-1] if steps else 'none'}"
            )


def _truncate_metrics(run: RunDir, step: int) -> None:
    """Drop log lines past ``step`` (written after the checkpoint a resumed run starts from)."""
    if not run.metrics.exists():
        return
    lines = run.metrics.read_text(encoding="utf-8").splitlines()
    kept = []
    for line in lines:
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut short by a crash
    if len(kept) != len(lines):
        atomic_write_text(run.metrics, "".join(k + "\n" for k in kept))
