"""A run that starts from another's trained weights (``train.init_from``): the pre-train, then
fine-tune recipe of BERT. Every tensor of the new model whose name the initialising run trained is
copied (a different shape is an error naming it); the rest keep their fresh initialisation.

    RUN_DIR/init.json   {"source": ..., "loaded": [...], "new": [...], "unused": [...], "untrained": [...]}

records what was copied, what was initialised here, what of the source this model has no place
for, and which tensors this run's task never trains (its ``untrained`` modules, less those loaded):
a masked-LM run's classifier, a classifier's masked-LM head. A run started from this one skips
those, so that random weights are never reported as loaded.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from attnlab.errors import CheckpointError
from attnlab.runs.checkpoint import build_run_model, checkpoint_file
from attnlab.runs.checkpoint_files import MODEL_FILE
from attnlab.runs.config import init_source
from attnlab.runs.run_dir import RunDir
from attnlab.runs.weights_file import load_weights
from attnlab.tasks import Task

LAYER = re.compile(r"^(.*?\.layers\.(\d+))\.")  # a parameter's layer: 'encoder.layers.3.' -> ('encoder.layers.3', '3')


@dataclass(frozen=True)
class InitReport:
    """What starting from ``source`` did, by tensor name (written to init.json)."""

    source: str
    loaded: list[str]
    new: list[str]
    unused: list[str]
    untrained: list[str]

    def lines(self, verb: str = "init_from") -> list[str]:
        """One line each for loaded, new and unused, the names grouped (:func:`grouped`)."""
        return [
            f"{verb} {self.source}: {what} {len(names)} tensor{'s' * (len(names) != 1)}"
            f"{': ' + grouped(names) if names else ''}"
            for what, names in (("loaded", self.loaded), ("initialised new", self.new), ("unused", self.unused))
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def named_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights by name, each tensor once (a tied output projection is its embedding)."""
    saved = model.state_dict().keys()  # persistent buffers only
    return dict(model.named_parameters()) | {name: b for name, b in model.named_buffers() if name in saved}


def copy_tensors(target: dict[str, torch.Tensor], source: dict[str, torch.Tensor], where: str) -> list[str]:
    """Copy each tensor of ``source`` into the ``target`` tensor of the same name; the names
    copied. A shape that differs is an error naming the tensor (``where`` says whose)."""
    shared = [name for name in target if name in source]
    with torch.no_grad():
        for name in shared:
            if source[name].shape != target[name].shape:
                raise CheckpointError(
                    f"{where}: {name} has shape {tuple(source[name].shape)} there and {tuple(target[name].shape)} here"
                )
            target[name].copy_(source[name])
    return shared


def untrained_by(task: Task[Any, Any], names: list[str]) -> list[str]:
    """The names of tensors in modules ``task``'s loss never reaches."""
    return [name for name in names if any(name.startswith(prefix) for prefix in task.untrained)]


def untrained_of(run: RunDir, model: nn.Module, task: Task[Any, Any] | None = None) -> set[str]:
    """The names of ``run``'s ``model``'s tensors that hold no trained values: as init.json lists
    them, or, for a run started from scratch, those its ``task`` (by default the one its config.yaml
    names: a run being started passes its own, which ranks other than 0 have not read from disk)
    never trains."""
    if run.init.exists():
        return set(run.read_init()["untrained"])
    return set(untrained_by(task or run.read_config()[1].task, list(named_tensors(model))))


def trained_tensors(run: RunDir, model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of ``run``'s ``model`` that hold trained values."""
    untrained = untrained_of(run, model)
    return {name: t for name, t in named_tensors(model).items() if name not in untrained}


def initialise_from(model: nn.Module, init_from: str, task: Task[Any, Any]) -> InitReport:
    """Copy into ``model`` the trained tensors of the run (or checkpoint) ``init_from`` that it has."""
    run_path, checkpoint = init_source(init_from)
    run = RunDir(run_path)
    source = build_run_model(run, run.read_config()[0], run.read_shape())
    load_weights(source, checkpoint / MODEL_FILE if checkpoint is not None else checkpoint_file(run))
    trained, target = trained_tensors(run, source), named_tensors(model)
    loaded = copy_tensors(target, trained, f"train.init_from {init_from}")
    return InitReport(
        str(init_from),
        loaded,
        [name for name in target if name not in trained],
        [name for name in trained if name not in target],
        [name for name in untrained_by(task, list(target)) if name not in loaded],
    )


def grouped(names: list[str]) -> str:
    """Tensor names shortened to their modules, the layers of a stack as ranges (init.json has each
    name): 'embed.tokens, encoder.layers.0-5, mlm_head.bias, mlm_head.norm'."""
    modules: dict[str, list[int]] = {}  # module -> its layer numbers (none outside the stacks)
    for name in names:
        if match := LAYER.match(name):
            modules.setdefault(match[1].rsplit(".", 1)[0], []).append(int(match[2]))
        else:
            module = name.rsplit(".", 1)[0]
            modules.setdefault(module if "." in module else name, [])  # a model's own 'mlm_head.bias' stays
    return ", ".join(
        f"{module}.{_ranges(sorted(set(layers)))}" if layers else module for module, layers in modules.items()
    )


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 4] -> '0-2,4'."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
