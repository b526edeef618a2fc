"""A whole training run's config (model, data and train: runs/train_config.py's TrainConfig).

The model section is the family's own (attnlab/models), typed when the file is read; the data
section the task's (attnlab/tasks). The sizes the data decides (vocabularies, the pad id, image
sizes, classes) are in neither: the task gives them as a DataShape (models/shape.py), which the
family's builder takes beside the model config.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.config import apply_overrides, field_paths, one_of, overlaid, read_config_file
from attnlab.errors import ConfigError
from attnlab.models import FAMILIES, FamilyConfig, ModelFamily, family_named, model_config, stack_of
from attnlab.models.family import DEFAULT_ARCH
from attnlab.models.shape import SIZES, DataShape
from attnlab.models.transformer_config import Output
from attnlab.runs.migration import migrated_data, migrated_model, refuse_moved, refuse_moved_data
from attnlab.runs.train_config import TrainConfig
from attnlab.tasks import Task, TaskConfig, task_config
from attnlab.tasks.task import task_of


@dataclass
class RunConfig:
    """A whole training run: the model's config, the task's data section and the train section, each
    typed; the sizes the data decides are the task's :meth:`planned_shape` (before the data is read)
    or the prepared data's (runs/data.py: ``shape_of``)."""

    model: FamilyConfig
    data: TaskConfig
    train: TrainConfig

    @classmethod
    def from_sections(cls, sections: dict[str, Any], where: str = "", complete: bool = False) -> "RunConfig":
        """The run ``sections`` describe; a model section under ``train.init_from`` starts from the
        initialising run's (its fields override), unless it is ``complete`` (a run's own config)."""
        prefix = f"{where}: " if where else ""
        try:
            model = sections.get("model") or {}
            if not isinstance(model, dict):
                raise ConfigError("section 'model' must be a mapping of field: value")
            if not complete:
                refuse_moved(model.get("arch", DEFAULT_ARCH), model)
                data_section = sections.get("data")
                refuse_moved_data(data_section, data_section if isinstance(data_section, dict) else {})
            if "shape" in sections:
                raise ConfigError(
                    "section 'shape' gives the sizes of a model config without data; a training "
                    "config's come from its data: remove it"
                )
            data = task_config(sections.get("data") or {})
            data.check_trainable()
            train_section = sections.get("train")
            if isinstance(train_section, dict) and train_section.get("init_from") and not complete:
                model = _over_initialising_model(model, str(train_section["init_from"]))
            _check_fits(family_named(model.get("arch", DEFAULT_ARCH)), data.task)
            model_cfg = model_config(model)
            model_cfg.check_shape(data.task.data_shape())  # the sizes the config alone tells
            train = TrainConfig.from_dict(sections.get("train") or {})
            _check_run(model_cfg, data, train)
            return cls(model_cfg, data, train)
        except ConfigError as err:
            raise ConfigError(f"{prefix}{err}") from None

    @classmethod
    def from_file(cls, path: str | Path, overrides: typing.Sequence[str] = (), of_a_run: bool = False) -> "RunConfig":
        """The config in ``path`` with ``--set`` overrides; ``of_a_run``: a run directory's
        config.yaml, whose model section also holds the fields its data set (and, written by
        release 0.1, the fields of every family, and the data fields of every format)."""
        sections = read_config_file(path)
        model = sections.get("model")
        arch = model.get("arch", DEFAULT_ARCH) if isinstance(model, dict) else DEFAULT_ARCH
        for expr in overrides:
            key = expr.partition("=")[0].strip()
            if key.startswith("model."):
                refuse_moved(arch, [key.removeprefix("model.")], f"--set {expr!r}: ")
            if key.startswith("data."):
                refuse_moved_data(sections.get("data"), [key.removeprefix("data.")], f"--set {expr!r}: ")
        if of_a_run:
            sections = _run_sections(sections, path)
        apply_overrides(sections, overrides, override_fields)
        where = " ".join([str(path), *(f"--set {expr}" for expr in overrides)])  # the error may be in either
        return cls.from_sections(sections, where, complete=of_a_run)

    def planned_shape(self, vocab_size: int | None = None) -> DataShape:
        """The sizes the data will give, as the config alone tells them; ``vocab_size``: the
        vocabulary its tokenizers are not fitted to yet (the data section's, in a plan)."""
        shape = self.data.task.data_shape()
        return shape.with_vocabulary(vocab_size) if vocab_size is not None and self.data.task.tokenizers else shape


def init_source(init_from: str) -> tuple[Path, Path | None]:
    """The run directory ``train.init_from`` names, and the checkpoint directory it names (None: the
    run's best checkpoint)."""
    path = Path(init_from)
    if (path / "config.yaml").is_file():
        return path, None
    if (path / "model.safetensors").is_file() and (path.parent.parent / "config.yaml").is_file():
        return path.parent.parent, path
    raise ConfigError(
        f"train.init_from: {path} is neither a run directory (with config.yaml) nor one of its "
        f"checkpoint directories (with model.safetensors)"
    )


def _run_sections(sections: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """The sections of a run's config.yaml (``path``) as a training config: its data section as this
    release reads it (release 0.1's too), its model section as this release reads it (the sizes an
    earlier release kept there left out: runs/migration.py)."""
    if not isinstance(sections.get("data"), dict):
        return sections  # not a run's: RunConfig refuses it
    try:
        data = task_config(migrated_data(sections["data"]))
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    sections = {**sections, "data": data.to_dict()}
    if isinstance(sections.get("model"), dict):
        sections["model"] = migrated_model(sections["model"])
    return sections


def _over_initialising_model(model: dict[str, Any], init_from: str) -> dict[str, Any]:
    """The initialising run's model section updated with ``model``; the two must be of one family."""
    run, _ = init_source(init_from)
    base = _run_sections(read_config_file(run / "config.yaml"), run / "config.yaml").get("model") or {}
    arch = model.get("arch", base.get("arch", DEFAULT_ARCH))
    if arch != base.get("arch", DEFAULT_ARCH):
        raise ConfigError(
            f"train.init_from: {run} is a run of model.arch '{base.get('arch', DEFAULT_ARCH)}'; this "
            f"config's model.arch is '{arch}': weights initialise a model of their own family only"
        )
    return overlaid(base, model)


def _check_fits(family: type[ModelFamily], task: Task[Any, Any]) -> None:
    """The family has the capabilities the task needs."""
    if not task.fits(family.capabilities):
        fits = [repr(name) for name, f in FAMILIES.items() if task.fits(f.capabilities)]
        listed = " or ".join([", ".join(fits[:-1]), fits[-1]] if len(fits) > 1 else fits)
        raise ConfigError(f"model.arch must be {listed} for data.task '{task.name}'; got '{family.name}'")


def _check_run(model: FamilyConfig, data: TaskConfig, train: TrainConfig) -> None:
    """Checks across sections (the family's fit to the task came first): the task has the metrics
    asked for, and positions fit the lengths."""
    task = data.task
    one_of("train.early_stop_metric", train.early_stop_metric, task.metrics)
    if train.eval_exact_match and "exact_match" not in task.metrics:
        raise ConfigError(
            f"train.eval_exact_match needs a task that predicts sequences to compare; data.task "
            f"'{task.name}' has no exact match (set it to 0)"
        )
    if train.lr_schedule == "noam" and stack_of(model) is None:
        raise ConfigError(
            f"train.lr_schedule 'noam' scales the rate by d_model^-0.5, which arch '{model.arch}' does not "
            f"have; use 'cosine' or 'constant'"
        )
    output = getattr(model, "output", None)  # the output projection of a family that predicts tokens
    if isinstance(output, Output) and output.never and train.label_smoothing > 0:
        raise ConfigError(
            f"model.output.vocabulary '{output.vocabulary}' gives some tokens logit -inf, and "
            f"label smoothing would give them probability; set train.label_smoothing: 0"
        )
    longest = data.longest_sequence
    if model.max_positions is not None and longest is not None:
        if longest > model.max_positions:
            raise ConfigError(
                f"model.{'positions.' if 'positions' in model.field_names() else ''}max_len "
                f"({model.max_positions}) must cover the longest sequence ({longest}) "
                f"with learned positions"
            )


def override_fields(section: str, sections: dict[str, Any]) -> list[str] | None:
    """The fields ``--set`` may name in ``section``: the model's are those of the family its arch
    names, the data's those of its task (a part's as 'splits.n_train'; None for an unknown arch or task, which the config then
    refuses with the list)."""
    if section == "model":
        arch = (sections.get("model") or {}).get("arch", DEFAULT_ARCH)
        return field_paths(FAMILIES[arch].config) if arch in FAMILIES else None
    if section == "data":
        try:
            return ["task", *field_paths(task_of(sections.get("data") or {}).config)]
        except ConfigError:
            return None
    if section == "shape":
        return sorted(SIZES)
    return [f.name for f in dataclasses.fields(TrainConfig)]
