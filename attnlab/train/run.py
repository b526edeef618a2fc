"""A training run from a config: prepare the data, build the model, fit, and write the run directory."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from torch import nn

from attnlab.files import atomic_write_text
from attnlab.models import FamilyConfig, stack_of
from attnlab.nn.layers import LayerStack
from attnlab.parallel.distributed import World
from attnlab.runs.config import RunConfig
from attnlab.runs.init import grouped
from attnlab.runs.opening import open_run
from attnlab.tasks import TaskData
from attnlab.train.loop import fit
from attnlab.train.schedules import run_schedule
from attnlab.train.step import freeze
from attnlab.train.strategy import check_batches, check_strategy


def train_run(
    cfg: RunConfig,
    out: str | Path,
    resume: bool = False,
    log: Callable[[str], None] = print,
    world: World | None = None,
    allow_changes: bool = False,
    resume_from: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
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
    frozen: list[str] = []

    def check(model_cfg: FamilyConfig, data: TaskData) -> None:  # before anything is built or written
        check_strategy(cfg.train.strategy, model_cfg, world, cfg.train.tensor_parallel, cfg.data.task)
        check_batches(cfg.train, data, world)

    def adapt(model: nn.Module) -> None:
        frozen.extend(freeze(model, cfg.train.freeze_embeddings, cfg.train.freeze_layers))

    opened = open_run(cfg, out, resume, resume_from, allow_changes, main, log, check, adapt)
    model, model_cfg, run, untrained = opened.model, opened.model_cfg, opened.run, opened.untrained
    if frozen:
        log(f"frozen {len(frozen)} tensors: {grouped(frozen)}")
    for module in model.modules():
        if isinstance(module, LayerStack):
            module.checkpoint_activations = cfg.train.activation_checkpointing
    idle = [name for name, _ in model.named_parameters() if name in untrained]
    n_params = sum(p.numel() for name, p in model.named_parameters() if name not in untrained)
    aside = (
        f" (and {sum(p.numel() for name, p in model.named_parameters() if name in untrained):,} in "
        f"{grouped(idle)}, never trained)"
        if idle
        else ""
    )
    log(f"model: {model_cfg.arch}, {n_params:,} parameters{aside}; run directory {run.path}")
    stack = stack_of(model_cfg)
    schedule, note = run_schedule(cfg.train, stack.d_model if stack else None)
    if note:
        log(note)
    summary = fit(
        model,
        cfg.data.task,
        opened.data,
        cfg.train,
        run,
        schedule,
        resume=opened.point,
        log=log,
        world=world,
        on_restored=lambda: opened.restored(log),
        clock=clock,
    )
    summary = {"run_dir": str(run.path), "arch": model_cfg.arch, "n_params": n_params, **summary}
    if main:
        atomic_write_text(run.summary, json.dumps(summary, indent=2))
    return summary
