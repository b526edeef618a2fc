"""A run opened for training: a new one started, or a stopped one resumed, as one typed object.

``open_run`` reads and checks what it is given (on resume: the run's own config, its data and model
unchanged, the checkpoint it resumes from read whole and verified, the train settings that differ),
prepares the task's data with the right tokenizers, builds the model (less the pruned heads,
initialised from ``train.init_from``) and, for a new run, writes its config, tokenizers, task state
and init.json. Nothing of a resumed run changes here: its leftovers are removed, newer checkpoints set
aside and changed settings recorded by ``OpenRun.restored``, once the trainer has loaded the checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from attnlab.config import differences
from attnlab.errors import CheckpointError, ConfigError
from attnlab.models import FamilyConfig
from attnlab.models.shape import DataShape
from attnlab.runs.checkpoint import build_run_model
from attnlab.runs.checkpoint_files import Checkpoint
from attnlab.runs.config import RunConfig
from attnlab.runs.data import prepare, shape_of
from attnlab.runs.init import InitReport, initialise_from, untrained_of
from attnlab.runs.run_dir import RunDir
from attnlab.runs.train_config import TrainConfig
from attnlab.tasks import TaskConfig, TaskData

DISPLAY_ONLY = ("train.progress", "train.log_every")  # change what is shown, not what is trained: never refused


@dataclass
class OpenRun:
    """A run ready to train: its directory, the checkpoint it resumes from (None: from step 0), its
    data and model (built, initialised, not yet loaded from ``point``), the model config and the data's
    sizes it is built with, what
    ``train.init_from`` loaded (``report``), the names of the tensors that hold no trained values and
    the train settings changed on resume."""

    cfg: RunConfig
    run: RunDir
    point: Checkpoint | None
    data: TaskData
    model_cfg: FamilyConfig
    shape: DataShape
    model: nn.Module
    report: InitReport | None
    untrained: set[str]
    changes: list[str]
    main: bool

    def restored(self, log: Callable[[str], None]) -> None:
        """The resume is known to succeed (the checkpoint is loaded): now the run may change. Removes
        half-written checkpoints, sets aside those after the resumed step, records changed settings."""
        if not self.main or self.point is None:
            return
        run, train, step = self.run, self.cfg.train, self.point.step
        _remove_leftovers(run, log)
        aside = run.set_aside_after(step, train.early_stop_metric, self.cfg.data.task.metrics[train.early_stop_metric])
        if aside is not None:
            log(f"resuming from step {step}: the newer checkpoints are set aside in {aside}")
        if self.changes or not run.shape.is_file():  # a run written before shape.json gets one
            run.write_config(self.model_cfg, self.shape, self.cfg.data, train)
        if self.changes:
            run.record_config_changes(step, self.changes)
            log(f"train settings changed at step {step}: {'; '.join(self.changes)} (recorded in {run.config_changes})")


def open_run(
    cfg: RunConfig,
    out: str | Path,
    resume: bool,
    resume_from: int | None,
    allow_changes: bool,
    main: bool,
    log: Callable[[str], None],
    check: Callable[[FamilyConfig, TaskData], None],
    adapt: Callable[[nn.Module], None],
) -> OpenRun:
    """The run directory ``out`` opened to train as ``cfg`` says: started, or with ``resume`` continued
    from its newest checkpoint or from step ``resume_from`` (a run killed before its first checkpoint
    starts again from step 0). ``check``: the trainer's refusals of the model config and data (its
    strategy, its batches), and ``adapt``: what it does to the built model (freezing), both called
    before anything is written, so that a refused run leaves no file. ``main``: this process writes
    (rank 0 under torchrun).

    A resumed run keeps its model and data; a train section that differs from the run's is refused,
    listing the differences, unless ``allow_changes``. Nothing of a resumed run is written here."""
    run = RunDir(out)
    resume = resume or resume_from is not None
    saved: tuple[FamilyConfig, TaskConfig, TrainConfig] | None = None
    if resume and not run.steps() and resume_from is None:
        run.read_config()  # it must be a run directory, if one killed before its first checkpoint
        if main:
            _remove_leftovers(run, log)
        log(f"{run.path}: no complete checkpoint yet; starting from step 0")
    elif resume:
        saved = run.read_config()
        if saved[1] != cfg.data:
            raise ConfigError(
                f"{run.config}: a resumed run keeps its data, but the given config differs "
                f"({'; '.join(differences(saved[1], cfg.data))})"
            )
    # a resumed run's data is read with its own tokenizers and task state
    data = prepare(cfg.data, cfg.train, run if saved is not None else None)
    model_cfg, shape = cfg.model, shape_of(cfg, data)
    point: Checkpoint | None = None
    changes: list[str] = []
    if saved is not None:
        if model_cfg != saved[0]:
            raise ConfigError(
                f"{run.config}: a resumed run keeps its model, but the given config differs "
                f"({'; '.join(differences(saved[0], model_cfg))})"
            )
        kept = run.read_shape()
        if shape != kept:
            raise ConfigError(
                f"{run.shape}: a resumed run keeps its data's sizes, but its data now gives "
                f"{shape.to_dict()} (the run's: {kept.to_dict()})"
            )
        point = _resume_point(run, resume_from)
        changes = _train_changes(run, saved[2], cfg.train, allow_changes)
    check(model_cfg, data)
    task = cfg.data.task
    log(task.describe(data))
    torch.manual_seed(cfg.train.seed)
    model = build_run_model(run, model_cfg, shape)
    report = initialise_from(model, cfg.train.init_from, task) if cfg.train.init_from and point is None else None
    adapt(model)
    # the parameters that hold trained values or that this run trains; a head that neither the source
    # run nor this task ever trains (an imported BertModel's masked-LM head, in a classifier) is left out
    untrained = set(report.untrained) if report is not None else untrained_of(run, model, task)
    # config.yaml once the model is whole: it marks the directory as a run, so that a run killed
    # before its first checkpoint can be resumed (from step 0) rather than refused as someone else's
    if main and point is None:
        run.write_start(
            model_cfg,
            shape,
            cfg.data,
            cfg.train,
            {role: data.tokenizers[role] for role in task.tokenizers},
            task.saved_state(data),
            report.to_dict() if report is not None else None,
        )
    for line in report.lines() if report is not None else []:
        log(line)
    return OpenRun(cfg, run, point, data, model_cfg, shape, model, report, untrained, changes, main)


def _train_changes(run: RunDir, saved: TrainConfig, given: TrainConfig, allow: bool) -> list[str]:
    """A resumed run's train settings that differ from its own, refused unless ``allow``."""
    changes = [c for c in differences(saved, given) if c.split(":")[0] not in DISPLAY_ONLY]
    if changes and not allow:
        raise ConfigError(
            f"{run.config}: resuming with train settings that differ from the run's: "
            f"{'; '.join(changes)}. Resume without a config or --set to keep the run's own (`attnlab train "
            f"--out {run.path} --resume`), or pass --allow-changes to train on with these"
        )
    return changes


def _remove_leftovers(run: RunDir, log: Callable[[str], None]) -> None:
    for stale in run.remove_partial_checkpoints():
        log(f"removed {stale.name}, a checkpoint that an interrupted run left half-written")


def _resume_point(run: RunDir, step: int | None) -> Checkpoint:
    """The checkpoint to resume from (``step``, or the newest), read whole and verified; a damaged one is
    refused in one line that names the newest intact one before it and the command that resumes from it."""
    steps = run.steps()
    if step is not None and step not in steps:
        raise CheckpointError(
            f"--resume-from: {run.path} has no checkpoint of step {step} (it has {', '.join(map(str, steps))})"
        )
    step = steps[-1] if step is None else step
    try:
        return run.read_checkpoint(step)
    except CheckpointError as err:
        intact = next((s for s in reversed(steps) if s < step and run.intact(s)), None)
        if intact is None:
            raise CheckpointError(f"{err}; no older checkpoint of {run.path} is intact either") from None
        raise CheckpointError(
            f"{err}; the newest intact checkpoint before it is step {intact} "
            f"({run.step_dir(intact)}): resume from it with `attnlab train --out {run.path} "
            f"--resume-from {intact}` (the newer checkpoints are set aside, not deleted)"
        ) from None
