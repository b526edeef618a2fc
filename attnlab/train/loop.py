"""The training loop, usable without the command line: ``fit`` runs the schedule of updates
(train/step.py's ``train_step``, with the task's loss), evaluations (the task's metrics),
checkpoints (when: train/checkpointing.py), logs and early stopping, and resumes exactly from the
newest checkpoint of a run directory. It knows a task's data only through tasks/task.py's interface.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from attnlab.device import resolve_device, use_device
from attnlab.parallel.distributed import World
from attnlab.precision import allow_tf32, autocast, choose_precision
from attnlab.runs.checkpoint_files import MODEL_FILE, Checkpoint
from attnlab.runs.run_dir import RunDir
from attnlab.runs.train_config import GRAPHS, TrainConfig
from attnlab.runs.weights_file import load_weights, put_weights
from attnlab.tasks import Task, TaskData
from attnlab.tasks.batching import Batch, BucketedData
from attnlab.train.checkpointing import Autosave, CtrlC, Evaluations
from attnlab.train.progress import Health, Heartbeat, Progress, TrainLog
from attnlab.train.schedules import Schedule, make_scheduler
from attnlab.train.step import compiled, make_optimizer, train_step
from attnlab.train.strategy import Strategy, strategy_for


class Limits:
    """When training stops: max_steps, max_epochs, early stopping, or max_seconds, which caps each
    command's own training time (so that --resume continues a time-capped run); at once for a model
    with nothing to learn (a baseline without parameters, or everything frozen)."""

    def __init__(self, cfg: TrainConfig, learnable: bool) -> None:
        self.cfg, self.learnable = cfg, learnable
        self.session_seconds = 0.0

    def reached(self, progress: Progress) -> str | None:
        cfg = self.cfg
        if not self.learnable:
            return "nothing to learn: the model has no trainable parameters"
        if progress.step >= cfg.max_steps:
            return f"max_steps ({cfg.max_steps})"
        if cfg.max_seconds is not None and self.session_seconds >= cfg.max_seconds:
            return f"max_seconds ({cfg.max_seconds:g})"
        if cfg.max_epochs is not None and progress.epoch >= cfg.max_epochs:
            return f"max_epochs ({cfg.max_epochs})"
        if cfg.patience is not None and progress.bad_evals >= cfg.patience:
            return f"early stopping: no better {cfg.early_stop_metric} in {cfg.patience} evaluations"
        return None


def fit(
    model: nn.Module,
    task: Task[Any, Any],
    data: TaskData,
    cfg: TrainConfig,
    run: RunDir,
    schedule: Schedule,
    resume: Checkpoint | None = None,
    log: Callable[[str], None] = print,
    world: World | None = None,
    on_restored: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Train ``model`` on ``task``'s prepared ``data`` until max_steps, max_epochs, max_seconds or
    early stopping, with the task's loss, validated by its metrics, the learning rate of update k
    ``schedule(k)`` (train/schedules.py's ``run_schedule``).

    Evaluates and checkpoints every ``eval_every`` steps and at the end, and checkpoints without
    evaluating once ``checkpoint_minutes`` pass without a checkpoint; logs every ``log_every`` steps
    to metrics.jsonl and TensorBoard, and a progress line at least every minute; ``clock`` (seconds,
    read once an update) is the wall clock of those two. With ``resume`` (a checkpoint of ``run``,
    read and verified), continues from it (weights, optimizer, schedule, data position and RNG states), and calls
    ``on_restored`` once all of it is in place, before anything is written. Returns a summary.
    With ``world`` (torchrun), this rank trains as ``strategy`` says (its share of each global
    batch under DDP or FSDP, its share of each layer under tensor parallelism, its stage of the
    layers under pipeline parallelism: train/strategy.py), and only rank 0 writes. A model with no
    trainable parameters is evaluated and checkpointed once, at step 0.
    """
    # -- build: device, precision, optimiser, schedule, and where training stands
    device = use_device(resolve_device(cfg.device))  # under torchrun: the GPU of this rank
    main = world is None or world.is_main
    precision = choose_precision(cfg.precision_on(device), device)
    if precision.note:
        log(precision.note)
    amp = autocast(precision.precision, device)
    allow_tf32(device)
    model.to(device)
    learnable = any(p.requires_grad for p in model.parameters())
    strategy = strategy_for(cfg, world, task)  # how the ranks share the work (train/strategy.py)
    trained = strategy.prepare(model, device) if learnable else model
    data_world = strategy.data_world  # the ranks that train different batches
    # the forward and the loss through TorchInductor; evaluation and checkpoints use the model itself
    cfg.check_runs_on(device, world.size if world else 1)
    objective = (
        compiled(task.loss, graphs=cfg.compile == GRAPHS, varied_shapes=isinstance(data, BucketedData))
        if cfg.compiles_on(device)
        else task.loss
    )
    optimizer = make_optimizer(model, cfg)
    scheduler = make_scheduler(optimizer, schedule)
    scaler = torch.amp.GradScaler("cuda") if precision.precision == "fp16" else None
    progress = Progress()
    if resume is not None:
        progress = _restore(resume, str(run.path), model, optimizer, scheduler, scaler, device, strategy)
        on_restored()
        log(f"resuming {run.path} from step {progress.step}")
    train_log, limits = TrainLog(run, cfg, progress, main, task.counts), Limits(cfg, learnable)
    health = Health(cfg, precision.precision, run, log, progress)
    evaluations = Evaluations(
        task,
        data,
        cfg,
        device,
        amp,
        train_log,
        run,
        strategy,
        functools.partial(_trainer_state, model, optimizer, scheduler, scaler, progress, device, strategy),
        resumed_at=progress.step if resume is not None else None,
    )
    now = clock()
    heartbeat = Heartbeat(cfg, progress, now, functools.partial(train_log.say, log=log), task.counts)
    autosave = Autosave(cfg, evaluations, now)

    def evaluate_or_stop(due: bool) -> str | None:
        """The one place that decides: evaluate and checkpoint when ``due`` or when a limit is
        reached (once a step), then say why training stops, if it does (early stopping counts the
        evaluation just made)."""
        if (due or limits.reached(progress) is not None) and evaluations.step != progress.step:
            health.look(progress)  # a checkpoint keeps numbers
            evaluations(progress, model)
        return limits.reached(progress)

    # -- the loop: step, log, evaluate and checkpoint, stop
    stop = evaluate_or_stop(due=False)  # a resumed run may be done; nothing to learn: evaluated once, at step 0
    with CtrlC(active=world is None) as ctrl_c:
        while stop is None:
            batches, end = _epoch(data, progress.epoch, cfg, data_world)
            for group, global_targets, consumed in _updates(batches, end, progress, cfg, data_world):
                started = time.perf_counter()
                out = train_step(
                    trained,
                    [b.to(device) for b in group],
                    optimizer,
                    scheduler,
                    cfg,
                    amp,
                    scaler,
                    layer_norms=(progress.step + 1) % cfg.log_every == 0,
                    world=data_world,
                    global_targets=global_targets,
                    objective=objective,
                    accumulate=strategy.accumulate_gradients,
                    clip=strategy.clip_gradients,
                )
                seconds = time.perf_counter() - started
                now = clock()
                # one clock for every rank's limits and periodic checkpoints: one all-reduce a step
                seconds, waited = (
                    world.all_max(seconds, autosave.waited(now)) if world else (seconds, autosave.waited(now))
                )
                progress.batch += consumed
                progress.train_seconds += seconds
                limits.session_seconds += seconds
                _count_step(progress, out, seconds)
                train_log.stepped()
                if main:
                    heartbeat(progress, now)
                if progress.step % cfg.log_every == 0:
                    health.look(progress)
                    train_log.train(progress, out)
                if (stop := evaluate_or_stop(due=progress.step % cfg.eval_every == 0)) is not None:
                    break
                if ctrl_c.requested:  # the update is done: keep it, then stop
                    health.look(progress)
                    evaluations.checkpoint_only(progress, model, "interrupted")
                    raise KeyboardInterrupt
                autosave(progress, model, health, now, waited)
            if progress.batch >= end:  # the epoch's batches are used up
                progress.epoch, progress.batch = progress.epoch + 1, 0
                stop = stop or evaluate_or_stop(due=False)
    train_log.close()
    progress.settle()
    said = "max_steps" if stop == f"max_steps ({cfg.max_steps})" else stop  # the count is just before
    log(f"stopped after {progress.step:,} steps ({said}), {progress.train_seconds:.1f} s of training")
    if stop.startswith("max_seconds") and progress.step < cfg.max_steps:
        log(
            f"not finished: step {progress.step} of {cfg.max_steps} when train.max_seconds ({cfg.max_seconds:g} s) "
            f"ran out; continue with `attnlab train --out {run.path} --resume`, or raise or remove train.max_seconds"
        )
    if world:
        world.barrier()  # rank 0's last checkpoint is on disk for everyone
    best_step = run.best_step()
    assert best_step is not None  # training ends with an evaluation: a run has its best checkpoint
    load_weights(model, run.step_dir(best_step) / MODEL_FILE)  # leave the best weights in the model
    return {
        "steps": progress.step,
        "epochs": progress.epoch,
        "stop_reason": stop,
        "train_seconds": round(progress.train_seconds, 2),
        f"train_{task.counts}": progress.targets,
        f"{task.counts}_per_s": round(progress.targets / max(progress.train_seconds, 1e-9), 1),
        "best_step": best_step,
        f"best_{cfg.early_stop_metric}": progress.best,
        "skipped_steps": progress.skipped_steps,
        "precision": precision.precision,
        "last_eval": evaluations.scores,
    }


def _epoch(data: TaskData, epoch: int, cfg: TrainConfig, world: World | None) -> tuple[Sequence[Batch], int]:
    """The batches of ``epoch`` and where its updates end: with several ranks an epoch's last global
    batch is dropped if it cannot give every rank its share."""
    batches = data.epoch_batches(epoch)
    span = cfg.accumulate * (world.size if world else 1)  # batches per update, all ranks together
    return batches, len(batches) - (span - 1 if world else 0)


def _updates(
    batches: Sequence[Batch], end: int, progress: Progress, cfg: TrainConfig, world: World | None
) -> Iterator[tuple[list[Batch], int, int]]:
    """The rest of an epoch, one update at a time, from ``progress.batch`` on: this rank's batches,
    the targets of the whole update (every rank's share, counted on the host, with no device
    sync) and how many of the epoch's batches it uses."""
    span = cfg.accumulate * (world.size if world else 1)
    while progress.batch < end:
        first = progress.batch + (world.rank * cfg.accumulate if world else 0)
        mine = [batches[j] for j in range(first, min(first + cfg.accumulate, len(batches)))]
        everyone = [batches[j] for j in range(progress.batch, progress.batch + span)] if world else mine
        yield mine, sum(b.n_targets for b in everyone), span if world else len(mine)


def _count_step(progress: Progress, out: dict[str, Any], seconds: float) -> None:
    """An update tried: the step and its targets, and on the device (no waiting for it), the log
    window's sums over the updates made and the counts of those skipped (:meth:`Progress.settle`)."""
    made = out["finite"]
    progress.step += 1
    progress.targets += out["targets"]
    progress.window_loss = progress.window_loss + torch.where(made, out["loss"] * out["targets"], 0.0)
    progress.window_nll = progress.window_nll + torch.where(made, out["nll"] * out["targets"], 0.0)
    progress.window_targets = progress.window_targets + made * out["targets"]
    progress.window_seconds += seconds
    progress.skipped_steps = progress.skipped_steps + ~made
    progress.bad_in_row = (progress.bad_in_row + 1) * ~made


def _trainer_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    progress: Progress,
    device: torch.device,
    strategy: Strategy,
) -> dict[str, Any]:
    """Tensors and plain values only: loads with torch.load(weights_only=True). A split model's
    optimizer state is gathered, by parameter name ("sharded" names the strategy)."""
    state = {
        "optimizer": strategy.optimizer_state(model, optimizer),
        "scheduler": scheduler.state_dict(),
        "progress": dict(vars(progress)),
        "rng_cpu": torch.get_rng_state(),
    }
    if strategy.layout is not None:
        state["sharded"] = strategy.layout
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    if device.type == "cuda":
        state["rng_cuda"] = torch.cuda.get_rng_state(device)
    return state


def _restore(
    checkpoint: Checkpoint,
    run_path: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    device: torch.device,
    strategy: Strategy,
) -> Progress:
    put_weights(model, checkpoint.path, checkpoint.weights, checkpoint.metadata)
    model.to(device)
    state = checkpoint.state
    strategy.check_resumable(run_path, state.get("sharded"))
    strategy.load_optimizer_state(model, optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and "scaler" in state:
        scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng_cpu"])
    if "rng_cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["rng_cuda"], device)
    return Progress.saved(state["progress"])
