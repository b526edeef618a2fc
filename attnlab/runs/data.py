"""A run's data and the model it makes: the task's data batched as the train section says, read
with the run's own tokenizers (read_run_data, for every command that uses a trained run), or with
those of the run it starts from (train.init_from); and the sizes the data gives the model."""

from __future__ import annotations

import dataclasses
from typing import Any

from attnlab.errors import ConfigError, UsageError
from attnlab.models.shape import DataShape
from attnlab.runs.config import RunConfig, init_source
from attnlab.runs.run_dir import RunDir
from attnlab.runs.train_config import TrainConfig
from attnlab.tasks import Batching, Task, TaskConfig, TaskData
from attnlab.tasks.batching import BucketedData, Tokenizers
from attnlab.tasks.parts import Files


def prepare(data_cfg: TaskConfig, train: TrainConfig, run: RunDir | None = None) -> TaskData:
    """The task's data, batched as ``train`` says; with a ``run``, read with its tokenizers and state;
    under ``train.init_from``, with the initialising run's tokenizers (its weights index their ids)."""
    batching = Batching(train.max_tokens, train.batch_size, train.seed, train.padding_multiple, train.sampling)
    if run is not None:
        data = data_cfg.task.prepare(batching, run.read_tokenizers(), run.read_task_state())
    elif train.init_from is not None:
        data = data_cfg.task.prepare(batching, _initialising_tokenizers(train.init_from, data_cfg.task))
    else:
        data = data_cfg.task.prepare(batching)
    if train.sampling != "epochs" and not isinstance(data, BucketedData):
        raise ConfigError(
            f"train.sampling '{train.sampling}' draws examples of a task that batches them by length "
            f"(translation, classification, masked_lm); data.task '{data_cfg.task.name}' batches its own "
            f"way: use sampling 'epochs'"
        )
    return data


def _initialising_tokenizers(init_from: str, task: Task[Any, Any]) -> Tokenizers:
    source = RunDir(init_source(init_from)[0])
    tokenizers = source.read_tokenizers()
    missing = [role for role in task.tokenizers if tokenizers.get(role) is None]
    if missing:
        raise ConfigError(
            f"train.init_from: {source.path} has no {' or '.join(missing)} tokenizer, which data.task "
            f"'{task.name}' reads with"
        )
    return tokenizers


def shape_of(cfg: RunConfig, data: TaskData) -> DataShape:
    """The sizes the prepared ``data`` gives the model (vocabulary sizes, ...)."""
    return cfg.data.task.data_shape(data)


def prepared_shape(cfg: RunConfig) -> DataShape:
    """The sizes ``cfg``'s data gives, the data prepared (its tokenizers fitted) to know them."""
    return shape_of(cfg, prepare(cfg.data, cfg.train))


def read_run_data(run: RunDir, split: str | None = None, text: str | None = None) -> TaskData:
    """The data ``run`` was trained on, read with its own tokenizers; ``split``, if given, must exist.
    ``text``: a file read instead as both the training and the validation text (a run imported from
    Hugging Face has no data of its own), for tasks whose data section names them."""
    _, data_cfg, train_cfg = run.read_config()
    if text is not None:
        files = getattr(data_cfg, "files", None)
        if not isinstance(files, Files):  # a section with split files has train and valid
            raise UsageError(f"--data: data.task '{data_cfg.task.name}' reads no text file of train and valid")
        data_cfg = dataclasses.replace(data_cfg, files=dataclasses.replace(files, train=text, valid=text))
    try:
        data_cfg.check_trainable()
    except ConfigError as err:  # an imported run: trained elsewhere, on data it does not have
        raise UsageError(f"{run.path} has no data of its own to read ({err})") from None
    data = prepare(data_cfg, train_cfg, run)
    if split is not None and split not in data.splits:
        raise UsageError(f"the run's data has no split '{split}' (it has {', '.join(data.splits)})")
    return data
