"""What a task shows of a run, and the registry that finds it by the run's task.

A task's presentation is a *view*, registered with the task's class (never its name) by
:func:`register_view`. Its abilities are separate protocols, found with ``isinstance``:

- :class:`Explorable`: a page of `attnlab serve` (the fields a request reads, what the page draws
  of an answer), the page's first input, and the answer to one request, computed with the shared
  steps of a :class:`attnlab.views.session.Session`;
- :class:`Inspectable`: `attnlab inspect` on one input, drawn with analysis/inspect.py's figures.

serve/ and the inspect command ask these and name no task; the page's script draws what
:class:`Page` describes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import torch
from torch import nn

from attnlab.analysis.inspect import figure_dir
from attnlab.errors import AttnlabError, DataError, UsageError
from attnlab.runs.checkpoint import load_run
from attnlab.runs.data import read_run_data
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.task import TASKS, Task
from attnlab.views.session import ImageReader, Session


@dataclass(frozen=True)
class Page:
    """What the explorer page shows of a task's runs. ``fields``: what a request reads besides the
    text and the heads switched off, with their defaults (their types are checked); ``image``:
    how an image input is read (None: the input is a sentence); ``audio``: the input is a recording
    (Session.audio reads it); ``output``: how the page draws
    the outputs ('nbest': a search's hypotheses, 'continuation': a prompt's continuation,
    'classes': class probabilities); ``steps``: which row of a map belongs to the output's step
    ('decoder': the decoder's rows, 'continuation': the prompt's last position onwards,
    'question': the question's words, 'none')."""

    fields: dict[str, Any] = field(default_factory=dict)
    image: ImageReader | None = None
    audio: bool = False
    output: Literal["nbest", "continuation", "classes"] = "classes"
    steps: Literal["decoder", "continuation", "question", "none"] = "none"

    @property
    def upload(self) -> tuple[str, str, str] | None:
        """The field an uploaded file comes in, that file, and the file a path names ('image', 'an image',
        'an image file'); None where the input is a sentence."""
        if self.audio:
            return "audio", "a recording", "an audio file"
        return None if self.image is None else ("image", "an image", "an image file")

    def describe(self) -> dict[str, Any]:
        """The page's description, as /api/info sends it to the page's script."""
        return {
            "input": "audio" if self.audio else "text" if self.image is None else "image",
            "options": self.fields,
            "output": self.output,
            "steps": self.steps,
        }


@runtime_checkable
class Explorable(Protocol):
    """A task whose runs `attnlab serve` explores."""

    page: Page

    def example(self, run: RunDir, tokenizers: dict[str, Any]) -> str | None:
        """The page's first input, from the run's validation data; None where there is none."""

    def answer(self, session: Session, text: str, **options: Any) -> dict[str, Any]:
        """One request's outputs and attention maps; ``options``: the page's fields, checked."""


@dataclass(frozen=True)
class Inspection:
    """One `attnlab inspect` of ``text`` (a sentence, or an image file's path): the loaded run, the
    given ``target`` and ``question`` (None: not given), the search's ``beam``, and ``figures``,
    which makes the folder the figures go to once the input has been read."""

    run: RunDir
    model: nn.Module
    tokenizers: dict[str, Any]
    cfg: Any  # the model section
    text: str
    target: str | None
    question: str | None
    beam: int
    figures: Callable[[], Path]

    def refuse_target(self, reads: str) -> None:
        """Refuse --tgt for a model without a decoder, which ``reads`` what it says."""
        if self.target is not None:
            raise UsageError(f"--tgt is for models with a decoder; {reads}")

    def refuse_question(self) -> None:
        """Refuse --question for a run that reads no question."""
        if self.question is not None:
            raise UsageError(
                f"--question is for single-stream runs (arch 'single_stream'); {self.run.path} holds arch "
                f"'{self.cfg.arch}'"
            )


@runtime_checkable
class Inspectable(Protocol):
    """A task whose runs `attnlab inspect` draws on one input."""

    def inspect(self, inspection: Inspection) -> dict[str, Any]:
        """Write the figures and summary.json of one input; the summary."""


VIEWS: dict[type[Task[Any, Any]], object] = {}
View = TypeVar("View")


def register_view(*tasks: type[Task[Any, Any]]) -> Callable[[type[View]], type[View]]:
    """Class decorator: an instance of the view shows the runs of each of ``tasks``."""

    def register(view: type[View]) -> type[View]:
        for task in tasks:
            VIEWS[task] = view()
        return view

    return register


def inspect_run(
    run_dir: str | Path,
    text: str,
    target: str | None,
    out: str | Path | None = None,
    beam: int = 4,
    checkpoint: str = "best",
    device: torch.device | str = "cpu",
    force: bool = False,
    question: str | None = None,
) -> dict[str, Any]:
    """Draw every attention map of ``text`` (an image file, for an image model; with ``question``, for a
    single-stream model) as the run's task's view draws them, into ``out`` (see
    :func:`attnlab.analysis.inspect.figure_dir`: by default a new folder in RUN_DIR/inspect), which
    is only made once the input has been read; summary.json's ``out`` names it."""
    run = RunDir(run_dir)
    task = run.read_config()[1].task
    view = view_of(task)
    if not isinstance(view, Inspectable):
        raise UsageError(
            f"{run_dir} is a run of data.task '{task.name}'; `attnlab inspect` draws runs of data.task "
            f"{' or '.join(map(repr, tasks_with(Inspectable)))}"
        )
    if isinstance(view, Explorable) and view.page.image is not None and not Path(text).is_file():
        raise DataError(
            f"--src {text}: no such file; a run of data.task '{task.name}' reads an image, so --src names an image file"
        )
    model, tokenizers, cfg = load_run(run_dir, checkpoint, device)
    return view.inspect(
        Inspection(
            run, model, tokenizers, cfg, text, target, question, beam, lambda: figure_dir(out, run_dir, text, force)
        )
    )


def view_of(task: Task[Any, Any]) -> object | None:
    """The view registered with ``task``'s class; None: the task shows nothing beyond the commands."""
    return VIEWS.get(type(task))


def tasks_with(ability: type) -> list[str]:
    """The names of the tasks whose views have ``ability`` (a protocol), for messages."""
    return [name for name, task in TASKS.items() if isinstance(VIEWS.get(task), ability)]


EXAMPLE_TOKENS = 48  # of a language model's validation text: the page's first input


def validation_start(run: RunDir) -> Any | None:
    """The first examples (a language model's first EXAMPLE_TOKENS tokens) of the run's validation
    data, for a page's first input; None where the run has no data here (an import, files since moved)."""
    try:
        return read_run_data(run, "valid").splits["valid"][0:EXAMPLE_TOKENS]
    except AttnlabError:
        return None
