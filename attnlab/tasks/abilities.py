"""What only some tasks can do, each a protocol of its own that the commands and training ask with
``isinstance`` (a task never says what it does by a flag, and no flag changes a call's signature):
evaluating a file of its own format (one that holds splits), a split of the run's data, decoding its evaluations by a
search, predicting classes, transcribing audio files, being trained through pipeline stages, and a validation pass whose
attention `inspect` captures. What every task has is :class:`attnlab.tasks.task.Task`."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Protocol, Self, TypeVar, runtime_checkable

import torch
from torch import nn

from attnlab.decode.spec import Greedy, Search
from attnlab.models.family import FamilyConfig
from attnlab.models.shape import DataShape
from attnlab.tasks.batching import Tokenizers
from attnlab.tasks.task import TaskConfig

DC = TypeVar("DC", contravariant=True)  # the data an ability's method reads
BC = TypeVar("BC", contravariant=True)  # the batch an ability's method reads
Prediction = tuple[str | None, list[float] | None]  # an input's name (None: line by line) and class probabilities


class Piped(NamedTuple):
    """A batch as pipeline parallelism feeds it (parallel/pipeline.py): ``inputs``, the first stage's
    arguments, and ``targets``, those of the loss after the last stage (each cut along its rows into
    micro-batches), which skips the targets equal to ``ignore_index``."""

    inputs: tuple[torch.Tensor, ...]
    targets: torch.Tensor
    ignore_index: int


@runtime_checkable
class Reports(Protocol):
    """What `attnlab evaluate` prints of an evaluation's record."""

    def report(self, result: dict[str, Any], source: str) -> list[str]:
        """The lines for a record of ``source`` (the file, or 'split NAME')."""
        ...


@runtime_checkable
class EvaluatesFiles(Reports, Protocol):
    """A task that scores a run on a file in its own format (`attnlab evaluate --data FILE`)."""

    def evaluate_file(
        self, model: nn.Module, tokenizers: Tokenizers, state: dict[str, Any], path: str, split: str | None
    ) -> dict[str, Any]:
        """The record of the file ``path``, read with the run's ``tokenizers`` and task ``state``;
        ``split``: a split of that file (--split), which a task whose files hold none refuses."""
        ...


@runtime_checkable
class EvaluatesFileSplits(EvaluatesFiles, Protocol):
    """An :class:`EvaluatesFiles` whose files hold splits (a forecaster's series: rows for training,
    validation and test), one of which `evaluate --data FILE --split NAME` scores."""

    @property
    def file_splits(self) -> tuple[str, ...]:
        """The splits a file holds, in order; evaluate_file scores the last without a split."""
        ...


@runtime_checkable
class EvaluatesSplits(Reports, Protocol[DC]):
    """A task that scores a run on a split of the run's own data (`attnlab evaluate --split NAME`)."""

    def evaluate_split(self, model: nn.Module, data: DC, split: str) -> dict[str, Any]:
        """The record of ``split`` of the prepared ``data``."""
        ...


@runtime_checkable
class Searched(Protocol):
    """A task whose evaluations decode (captions): by the search `attnlab evaluate` builds from its
    options (--beam, --lenpen, ...)."""

    def searching(self, search: Search) -> Self:
        """The task, its evaluations decoding by ``search``."""
        ...


class DecodesBySearch:
    """For a :class:`Searched` task (captioning, speech recognition): ``search``, what its evaluations
    decode by, greedy search until `evaluate` gives its own (``searching``: a copy of the task)."""

    search: Search = Greedy()

    def searching(self, search: Search) -> Self:
        task = copy.copy(self)
        task.search = search
        return task


@runtime_checkable
class Predicts(Protocol):
    """A task that reads the inputs of `attnlab predict` its own way (lines of text, image files) and
    gives each one's class probabilities. ``predict_options``: the `predict` options it takes (a
    zero-shot classifier's --labels, --prompts)."""

    @property
    def predict_options(self) -> tuple[str, ...]: ...

    def class_names(self, run: RunState, **options: str) -> list[str]:
        """The names of the classes :meth:`predict` gives probabilities of, in order."""
        ...

    def predict(
        self,
        model: nn.Module,
        run: RunState,
        inputs: list[str],
        input_file: str | None,
        batch_size: int,
        **options: str,
    ) -> list[Prediction]:
        """Each input's name (None: read line by line) and class probabilities."""
        ...


@runtime_checkable
class Transcribes(Protocol):
    """A task whose runs write down what they hear: `attnlab transcribe RUN a.wav ...`."""

    def transcribe(
        self, model: nn.Module, run: RunState, paths: list[str], search: Search
    ) -> list[list[tuple[str, float | None]]]:
        """Each audio file's transcripts by ``search``, best first, each with its score (None: unscored)."""
        ...


@runtime_checkable
class Pipelined(Protocol[BC]):
    """A task trained through pipeline stages (train.strategy pp): ``pipeline_head``, the model's
    method whose logits its loss reads ('forward', 'classify'), which the last stage ends with."""

    @property
    def pipeline_head(self) -> str: ...

    def piped(self, batch: BC) -> Piped:
        """``batch`` as the pipeline's stages read it."""
        ...


@runtime_checkable
class Analysed(Protocol[BC]):
    """A task whose runs `inspect --split` reads, capturing the attention of a validation pass."""

    def analysis_pass(self, model: nn.Module, batch: BC) -> dict[str, torch.Tensor]:
        """Run ``model`` on ``batch`` as validation does; the real (non-padding) queries of each
        stack, (B, T) by 'encoder' / 'decoder'."""
        ...


class RunState(Protocol):
    """What a task reads of a run directory (runs/run_dir.py: RunDir) to predict."""

    @property
    def path(self) -> Path: ...

    def read_config(self) -> tuple[FamilyConfig, TaskConfig, Any]: ...  # the model, data and train sections

    def read_shape(self) -> DataShape: ...

    def read_tokenizers(self) -> Tokenizers: ...

    def read_task_state(self) -> dict[str, Any]: ...


class PredictsLabels:
    """For a :class:`Predicts` task whose classes are its run's labels (its task state's, in id
    order), with no option of its own."""

    predict_options: ClassVar[tuple[str, ...]] = ()

    def class_names(self, run: RunState, **options: str) -> list[str]:
        labels: list[str] = run.read_task_state()["labels"]
        return labels
