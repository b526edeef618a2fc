"""What a task is, and the registry that selects one by ``data.task``.

A task is one module that declares a :class:`Task`: its data section (a :class:`TaskConfig`
dataclass with only its own fields), how it prepares that data into batches and fits the
tokenizers, which model fields the data sets (vocabulary sizes, ...), the training loss, the
validation metrics, the families it can train and the commands that use its runs. It registers
with ``@register_task``. A run's task is an instance made from its data section (``cfg.task``);
what only some tasks can do (evaluate a file, predict, be pipelined, ...) is a protocol of its own
(tasks/abilities.py), which training and the commands ask with ``isinstance``, never the task's name.
"""

from __future__ import annotations

from typing import (
    Any,
    Callable,
    ClassVar,
    ContextManager,
    Generic,
    Mapping,
    Protocol,
    Sequence,
    TypeVar,
    cast,
)

import torch
from torch import nn

from attnlab.config import TypedConfig, one_of, register
from attnlab.data.batching import Batch as TokenBatch
from attnlab.data.corpora import GENERATORS
from attnlab.data.tokenizers import PAD
from attnlab.errors import ConfigError, UsageError
from attnlab.eval.likelihood import evaluate, logits_of, teacher_forced_loss
from attnlab.models import Capabilities, Inputs
from attnlab.models.shape import DataShape
from attnlab.tasks.batching import Batching, TaskData, Tokenizers

Amp = Callable[[], ContextManager[Any]]
D = TypeVar("D")  # a task's prepared data (batching.TaskData)
B = TypeVar("B")  # one of its batches (batching.Batch)


class TaskConfig(TypedConfig):
    """Base of every task's data section: section 'data', ``task`` naming the task."""

    section: ClassVar[str] = "data"
    selector: ClassVar[str] = "task"
    link: ClassVar[str] = "task_class"
    task_class: ClassVar[type["Task[Any, Any]"]]  # set by @register_task
    # the fields of the composed ``splits`` part (tasks/parts.py: Splits) that the task reads, where
    # its section has one: Splits.read_by refuses the others, and an old run's flat ones move there
    splits_read: ClassVar[tuple[str, ...]] = ()

    @property
    def task(self) -> "Task[Any, Any]":
        """The task this section describes, made from it: the one way to a run's task."""
        return self.task_class(self)

    def check_trainable(self) -> None:
        """Refuse, with a ConfigError, a section that describes a run but could not train one (a
        run imported with no training data); every field has passed ``check``."""

    @property
    def longest_sequence(self) -> int | None:
        """The longest sequence a model reads in training (positions must cover it); None: unbounded."""
        return None

    @property
    def in_memory(self) -> bool:
        """Generated rather than read from files: quick to prepare (`attnlab info` builds its tokenizers)."""
        return False


class Task(Generic[D, B]):
    """One kind of learning problem, made from its data section: ``task = TaskClass(cfg)``, or
    ``cfg.task`` (:attr:`TaskConfig.task`). Every behaviour reads ``self.cfg``; the declarations a
    registry reads before any run are class attributes: ``name``, the value of data.task;
    ``config``, its data section's class; ``formats``, the values of data.format that imply it when
    data.task is not given; ``needs``, the capabilities a model family must have to learn it (a
    task reads tokens unless its ``needs`` name other ``inputs``); ``metrics``, the validation
    scores, each with whether lower is better (early_stop_metric chooses among them); ``commands``,
    the `attnlab` commands that use its runs; ``tokenizers``, the roles ('src', 'tgt') of the
    tokenizers it saves with a run, its data's ``tokenizers`` by role (a task without tokens
    declares none, and its data has none); ``untrained``, the modules of the model its loss never
    reaches (a masked-LM run's classifier), by name prefix, which a run started from it does not
    take as trained (runs/init.py); ``counts``, what its targets are, which its batches'
    ``n_targets`` count (tokens; a classifier's examples; a forecaster's values), naming the
    training log's throughput (``<counts>_per_s``) and the summary's ``train_<counts>``.

    The methods here are what every task does; ``D`` is its prepared data (a
    :class:`~attnlab.tasks.batching.TaskData`), ``B`` one of its batches (a
    :class:`~attnlab.tasks.batching.Batch`). What only some tasks do is an ability, a protocol
    of its own (tasks/abilities.py) found with ``isinstance``: ``EvaluatesFiles``,
    ``EvaluatesSplits``, ``Searched``, ``Predicts``, ``Pipelined`` and ``Analysed``."""

    name: ClassVar[str]
    config: ClassVar[type[TaskConfig]]
    formats: ClassVar[tuple[str, ...]] = ()
    needs: ClassVar[dict[str, Any]]  # capability -> value, checked at registration (Capabilities.check_needs)
    metrics: ClassVar[dict[str, bool]]
    commands: ClassVar[tuple[str, ...]]
    tokenizers: ClassVar[tuple[str, ...]] = ()
    untrained: ClassVar[tuple[str, ...]] = ()
    counts: ClassVar[str] = "tokens"  # what a batch's n_targets counts: the summary's train_<counts>, <counts>_per_s

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg

    @classmethod
    def fits(cls, capabilities: Capabilities) -> bool:
        """Whether a family of ``capabilities`` can learn the task (a registry's question, asked before any run)."""
        needs = {"inputs": Inputs.TOKENS} | cls.needs
        return all(getattr(capabilities, k) == v for k, v in needs.items())

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, Any] | None = None
    ) -> D:
        """Read the data; fit the tokenizers on the training split, or use the run's ``tokenizers``
        and ``state`` (what :meth:`saved_state` gave when the run was made)."""
        raise NotImplementedError

    def saved_state(self, data: D) -> dict[str, Any]:
        """What else a run keeps of its data, as JSON values (a classifier's labels); {} for none."""
        return {}

    def data_shape(self, data: D | None = None) -> DataShape:
        """The sizes the task's data gives a model, the one declaration of them: without ``data``,
        what the config alone tells (`attnlab info`, a sweep's planning, the run config's
        checks), a vocabulary as None (only the fitted tokenizer knows it:
        :meth:`DataShape.with_vocabulary`); with the prepared ``data``, every size. By default one
        vocabulary's, the tokenizer of the first role the task saves."""
        return DataShape(vocab_size=self.vocabulary(data, self.tokenizers[0]), pad_id=PAD)

    def vocabulary(self, data: D | None, role: str) -> int | None:
        """The vocabulary size of the prepared ``data``'s tokenizer of ``role``, one the task declares
        in ``tokenizers`` (it saves that tokenizer with a run); None without data."""
        if role not in self.tokenizers:
            raise TypeError(
                f"task {self.name!r} sets a vocabulary size from its {role!r} tokenizer: declare the "
                f"roles of the tokenizers it saves (tokenizers = ('src',), ('tgt',) or ('src', 'tgt'))"
            )
        if data is None:
            return None
        tokenizer = cast(TaskData, data).tokenizers[role]
        return None if tokenizer is None else tokenizer.vocab_size

    def loss(self, model: nn.Module, batch: B, label_smoothing: float, amp: Amp) -> tuple[torch.Tensor, torch.Tensor]:
        """(training loss, plain NLL), each summed over the batch's n_targets targets; the forward
        runs under ``amp``."""
        raise NotImplementedError

    def validate(
        self, model: nn.Module, data: D, device: torch.device, amp: Amp, n_decoded: int, split: str = "valid"
    ) -> dict[str, float]:
        """The metrics on ``split`` (``valid_loss`` always); ``n_decoded``: how many examples to
        predict for metrics that need predictions (train.eval_exact_match)."""
        raise NotImplementedError

    def describe(self, data: D) -> str:
        """One line on the prepared data, for the training log."""
        raise NotImplementedError

    def refuse_split(self, split: str | None) -> None:
        """For ``EvaluatesFiles.evaluate_file`` of a task whose files hold no splits: refuse a ``split``."""
        if split is not None:
            raise UsageError(
                f"--split with --data is for files that hold splits; a file of data.task '{self.name}' "
                f"holds none: give --data FILE, or --split NAME alone"
            )


class TokenData(Protocol):
    """The data of a :class:`NextTokenTask`: its evaluation batches are token batches."""

    def eval_batches(self, split: str) -> Sequence[TokenBatch]: ...


TD = TypeVar("TD", bound=TokenData)
TB = TypeVar("TB", bound=TokenBatch)


class NextTokenTask(Task[TD, TB]):
    """A task whose targets are tokens, each predicted from the true prefix (teacher forcing):
    translation, language modelling. Trained with the label-smoothed cross-entropy, validated by
    the NLL per target token and its perplexity."""

    def loss(self, model: nn.Module, batch: TB, label_smoothing: float, amp: Amp) -> tuple[torch.Tensor, torch.Tensor]:
        return teacher_forced_loss(model, batch, label_smoothing, amp)

    def validate(
        self, model: nn.Module, data: TD, device: torch.device, amp: Amp, n_decoded: int, split: str = "valid"
    ) -> dict[str, float]:
        scores = evaluate(model, list(data.eval_batches(split)), device, amp)
        return {"valid_loss": scores["loss"], "valid_ppl": scores["ppl"]}

    def analysis_pass(self, model: nn.Module, batch: TB) -> dict[str, torch.Tensor]:
        logits_of(model, batch)
        return {
            "encoder": batch.src != PAD if batch.src is not None else batch.tgt_in != PAD,
            "decoder": batch.tgt_in != PAD,
        }


TASKS: dict[str, type[Task[Any, Any]]] = {}
DEFAULT_TASK = "translation"

T = TypeVar("T", bound=type[Task[Any, Any]])


def register_task(task: T) -> T:
    """Class decorator: make ``task`` selectable as ``data.task: <task.name>``; what it ``needs`` of a
    family is checked against :class:`Capabilities` here, and that a task declaring no tokenizer
    says which sizes its data gives (the default :meth:`Task.data_shape` is the vocabulary of its
    first tokenizer); a vocabulary size taken from a tokenizer it does not declare is
    refused where the fields are first planned (:meth:`Task.vocabulary`)."""
    task.needs = Capabilities.check_needs(task.needs)
    if not task.tokenizers and task.data_shape is Task.data_shape:
        raise TypeError(
            f"task {task.name!r} declares no tokenizer, so its data sets no vocabulary: define its "
            f"data_shape(self, data=None), or declare the roles of the tokenizers it saves "
            f"(tokenizers = ('src',), ('tgt',) or ('src', 'tgt'))"
        )
    register(TASKS, cast(type[Task[Any, Any]], task), "task")
    return task


def task_named(name: Any) -> type[Task[Any, Any]]:
    """The registered task that ``data.task`` names; an unknown name is a ConfigError listing them."""
    if name in GENERATORS:  # release 0.1 named the generator data.task
        raise ConfigError(
            f"data.task names the task ({', '.join(map(repr, TASKS))}); '{name}' is a built-in "
            f"generator: write `generator: {{name: {name}}}` (with format: builtin)"
        )
    one_of("data.task", name, TASKS)
    return TASKS[name]


def task_of(data: Mapping[str, Any]) -> type[Task[Any, Any]]:
    """The task a data section names, or, without data.task, the first whose formats include its
    data.format (the default task without either)."""
    if "task" in data:
        return task_named(data["task"])
    return next((task for task in TASKS.values() if data.get("format") in task.formats), TASKS[DEFAULT_TASK])


def task_config(data: Any) -> TaskConfig:
    """The data section as its task's config (a run directory's, written by an earlier release, is
    read through runs/migration.py's migrated_data first)."""
    if not isinstance(data, dict):
        raise ConfigError(f"section 'data' must be a mapping of field: value (got {type(data).__name__})")
    return task_of(data).config.from_dict(data)
