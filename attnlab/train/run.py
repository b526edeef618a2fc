"""A training run from a config: prepare the data, build the model, fit, and write the run directory."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import torch

from attnlab.config import differences
from attnlab.errors import CheckpointError, ConfigError
from attnlab.files import atomic_write_text
from attnlab.models import stack_of
from attnlab.nn.layers import LayerStack
from attnlab.parallel.distributed import World
from attnlab.runs.checkpoint import build_run_model
from attnlab.runs.config import RunConfig, TrainConfig
from attnlab.runs.data import model_config_of, prepare
from attnlab.runs.init import grouped, initialise_from, untrained_of
from attnlab.runs.run_dir import Checkpoint, RunDir
from attnlab.train.loop import fit
from attnlab.train.schedules import run_schedule
from attnlab.train.step import freeze
from attnlab.train.strategy import check_batches, check_strategy

DISPLAY_ONLY = ("train.progress", "train.log_every")  # change what is shown, not what is trained: never refused


def _train_changes(run: RunDir, saved: TrainConfig, given: TrainConfig, allow: bool) -> list[str]:
    """A resumed run's train settings that differ from its own, refused unless ``allow``."""
    changes = [c for c in differences(saved, given) if c.split(":")[0] not in DISPLAY_ONLY]
    if changes and not allow:
        raise ConfigError(f"{run.config}: resuming with train settings that differ from the run's: "
                          f"{'; '.join(changes)}. Resume without a config or --set to keep the run's own (`attnlab train "
                          f"--out {run.path} --resume`), or pass --allow-changes to train on with these")
    return changes


def _remove_leftovers(run: RunDir, log: Callable[[str], None]) -> None:
    for stale in run.remove_partial_checkpoints():
        log(f"removed {stale.name}, a checkpoint that an interrupted run left half-written")


def _resume_point(run: RunDir, step: int | None) -> Checkpoint:
    """The checkpoint to resume from (``step``, or the newest), read whole and verified; a damaged one is
    refused in one line that names the newest intact one before it and the command that resumes from it."""
    steps = run.steps()
    if step is not None and step not in steps:
        raise CheckpointError(f"--resume-from: {run.path} has no checkpoint of step {step} (it has "
                              f"{', '.join(map(str, steps))})")
    step = steps[-1] if step is None else step
    try:
        return run.read_checkpoint(step)
    except CheckpointError as err:
        intact = next((s for s in reversed(steps) if s < step and run.intact(s)), None)
        if intact is None:
            raise CheckpointError(f"{err}; no older checkpoint of {run.path} is intact either") from None
        raise CheckpointError(f"{err}; the newest intact checkpoint before it is step {intact} "
                              f"({run.step_dir(intact)}): resume from it with `attnlab train --out {run.path} "
                              f"--resume-from {intact}` (the newer checkpoints are set aside, not deleted)") from None


def train_run(cfg: RunConfig, out: str | Path, resume: bool = False, log: Callable[[str], None] = print,
              world: World | None = None, allow_changes: bool = False, resume_from: int | None = None,
              clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Train as ``cfg`` says into the run directory ``out`` (or continue it with ``resume``, from its
    newest checkpoint or from step ``resume_from``) and return the summary written to
    ``out/summary.json``. With ``world`` (torchrun), every rank calls this; rank 0 alone writes and logs.

    A resumed run keeps its model and data; a train section that differs from the run's is refused,
    listing the differences, unless ``allow_changes``: then the run goes on with it and the changes
    are recorded in config_changes.jsonl. Nothing of a resumed run changes until its checkpoint is
    read, verified and loaded: a refused resume leaves every byte as it was. ``clock``: the wall
    clock of the progress lines and periodic checkpoints (train/loop.py's ``fit``)."""
    main = world is None or world.is_main
    log = log if main else (lambda line: None)
    run = RunDir(out)
    resume = resume or resume_from is not None
    point: Checkpoint | None = None
    changes: list[str] = []
    if resume and not run.steps() and resume_from is None:
        run.read_config()  # it must be a run directory, if one killed before its first checkpoint
        if main:
            _remove_leftovers(run, log)
        log(f"{run.path}: no complete checkpoint yet; starting from step 0")
    elif resume:
        model_cfg, data_cfg, train_cfg = run.read_config()
        if data_cfg != cfg.data:
            raise ConfigError(f"{run.config}: a resumed run keeps its data, but the given config differs "
                              f"({'; '.join(differences(data_cfg, cfg.data))})")
        data = prepare(data_cfg, cfg.train, run)
        if model_config_of(cfg, data) != model_cfg:
            raise ConfigError(f"{run.config}: a resumed run keeps its model, but the given config differs "
                              f"({'; '.join(differences(model_cfg, model_config_of(cfg, data)))})")
        point = _resume_point(run, resume_from)
        changes = _train_changes(run, train_cfg, cfg.train, allow_changes)
    if point is None:
        data = prepare(cfg.data, cfg.train)
        model_cfg = model_config_of(cfg, data)
    check_strategy(cfg.train.strategy, model_cfg, world, cfg.train.tensor_parallel, cfg.data.task)
    check_batches(cfg.train, data, world)
    task = cfg.data.task
    log(task.describe(data))
    torch.manual_seed(cfg.train.seed)
    model = build_run_model(run, model_cfg)
    report = initialise_from(model, cfg.train.init_from, task) if cfg.train.init_from and point is None else None
    frozen = freeze(model, cfg.train.freeze_embeddings, cfg.train.freeze_layers)
    # config.yaml once the model is whole: it marks the directory as a run, so that a run killed
    # before its first checkpoint can be resumed (from step 0) rather than refused as someone else's
    if main and point is None:
        run.write_config(model_cfg, cfg.data, cfg.train)
        run.write_tokenizers({role: data.tokenizers[role] for role in cfg.data.task.tokenizers})
        run.write_task_state(cfg.data.task.saved_state(data))
        if report is not None:
            run.write_init(report.to_dict())
    for line in report.lines() if report is not None else []:
        log(line)
    if frozen:
        log(f"frozen {len(frozen)} tensors: {grouped(frozen)}")
    for module in model.modules():
        if isinstance(module, LayerStack):
            module.checkpoint_activations = cfg.train.activation_checkpointing
    # the parameters that hold trained values or that this run trains; a head that neither the source
    # run nor this task ever trains (an imported BertModel's masked-LM head, in a classifier) is left out
    untrained = set(report.untrained) if report is not None else untrained_of(run, model, cfg.data.task)
    idle = [name for name, _ in model.named_parameters() if name in untrained]
    n_params = sum(p.numel() for name, p in model.named_parameters() if name not in untrained)
    aside = f" (and {sum(p.numel() for name, p in model.named_parameters() if name in untrained):,} in " \
            f"{grouped(idle)}, never trained)" if idle else ""
    log(f"model: {model_cfg.arch}, {n_params:,} parameters{aside}; run directory {run.path}")
    stack = stack_of(model_cfg)
    schedule, note = run_schedule(cfg.train, stack.d_model if stack else None)
    if note:
        log(note)

    def restored() -> None:  # the resume is known to succeed: now the run may change
        if not main or point is None:
            return
        _remove_leftovers(run, log)
        aside = run.set_aside_after(point.step, cfg.train.early_stop_metric, task.metrics[cfg.train.early_stop_metric])
        if aside is not None:
            log(f"resuming from step {point.step}: the newer checkpoints are set aside in {aside}")
        if changes:
            run.write_config(model_cfg, cfg.data, cfg.train)
            run.record_config_changes(point.step, changes)
            log(f"train settings changed at step {point.step}: {'; '.join(changes)} (recorded in {run.config_changes})")

    summary = fit(model, task, data, cfg.train, run, schedule, resume=point, log=log, world=world,
                  on_restored=restored, clock=clock)
    summary = {"run_dir": str(run.path), "arch": model_cfg.arch, "n_params": n_params, **summary}
    if main:
        atomic_write_text(run.summary, json.dumps(summary, indent=2))
    return summary
