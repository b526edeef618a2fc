"""What a task is, and the registry that selects one by ``data.task``.

A task is one module that declares a :class:`Task`: its data section (a :class:`TaskConfig`
dataclass with only its own fields), how it prepares that data into batches and fits the
tokenizers, which model fields the data sets (vocabulary sizes, ...), the training loss, the
validation metrics, the families it can train and the commands that use its runs. It registers
with ``@register_task``. Training and the commands ask the task, never its name.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, ContextManager, Mapping, NamedTuple

import torch
from torch import nn

from attnlab.config import RegisteredConfig, one_of, register
from attnlab.data.corpora import GENERATORS
from attnlab.data.tokenizers import PAD
from attnlab.errors import ConfigError
from attnlab.eval.likelihood import evaluate, logits_of, teacher_forced_loss
from attnlab.models import Capabilities, Inputs
from attnlab.models.shape import DataShape
from attnlab.tasks.batching import Batching, TaskData, Tokenizers

Amp = Callable[[], ContextManager]
Prediction = tuple[str | None, list[float] | None]  # an input's name (None: line by line) and class probabilities


class Piped(NamedTuple):
    """A batch as pipeline parallelism feeds it (parallel/pipeline.py): ``inputs``, the first stage's
    arguments, and ``targets``, those of the loss after the last stage (each cut along its rows into
    micro-batches), which skips the targets equal to ``ignore_index``."""

    inputs: tuple[torch.Tensor, ...]
    targets: torch.Tensor
    ignore_index: int


class TaskConfig(RegisteredConfig):
    """Base of every task's data section: section 'data', ``task`` naming the task."""

    section: ClassVar[str] = "data"
    selector: ClassVar[str] = "task"
    link: ClassVar[str] = "task"
    task: ClassVar[type["Task"]]  # set by @register_task

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


class Task:
    """One kind of learning problem. ``name`` is the value of data.task; ``config`` its data section;
    ``formats`` the values of data.format that imply it when data.task is not given; ``needs`` the
    capabilities a model family must have to learn it; ``metrics`` the validation scores, each with
    whether lower is better (early_stop_metric chooses among them); ``commands`` the `attnlab`
    commands that use its runs; :meth:`data_shape` the sizes its data gives a model (vocabularies,
    image sizes, classes: models/shape.py); ``tokenizers`` the roles ('src', 'tgt')
    of the tokenizers it saves with a run, its data's ``tokenizers`` by role (a task without tokens
    declares none, and its data has none); ``untrained`` the modules of the model its loss never
    reaches (a masked-LM run's classifier), by name prefix, which a run started from it does not
    take as trained (runs/init.py); ``counts`` what its targets are, which its batches' ``n_targets``
    count (tokens; a classifier's examples; a forecaster's values), naming the training log's
    throughput (``<counts>_per_s``) and the summary's ``train_<counts>``; ``evaluate_file``,
    where the task has it, scores a run on a file in the task's own format (`attnlab evaluate --data`;
    ``file_splits``: the file holds splits, and --split chooses one), and ``evaluate_split`` on a split
    of the run's own data (`--split`), both giving a record that ``report`` turns into lines (``searched``: both
    decode, by evaluate's --beam and --lenpen); ``predict``, where the task
    has it, reads the inputs of `attnlab predict` its own way (lines of text, image files) and gives
    each one's class probabilities (of ``class_names``), with the ``predict_options`` given. A task
    reads tokens unless its ``needs`` name other ``inputs``."""

    name: ClassVar[str]
    config: ClassVar[type[TaskConfig]]
    formats: ClassVar[tuple[str, ...]] = ()
    needs: ClassVar[dict[str, Any]]  # capability -> value, checked at registration (Capabilities.check_needs)
    metrics: ClassVar[dict[str, bool]]
    commands: ClassVar[tuple[str, ...]]
    tokenizers: ClassVar[tuple[str, ...]] = ()
    untrained: ClassVar[tuple[str, ...]] = ()
    counts: ClassVar[str] = "tokens"  # what a batch's n_targets counts: the summary's train_<counts>, <counts>_per_s
    evaluate_file: ClassVar[Callable[..., dict[str, Any]] | None] = None  # (model, cfg, tokenizers, state, path)
    evaluate_split: ClassVar[Callable[..., dict[str, Any]] | None] = None  # (model, data, split)
    file_splits: ClassVar[bool] = False  # evaluate_file takes (..., path, split)
    searched: ClassVar[bool] = False  # evaluate_file / evaluate_split decode: they take search= (decode/spec.py)
    predict: ClassVar[Callable[..., list[Prediction]] | None] = None  # (model, run, inputs, input_file, batch_size)
    predict_options: ClassVar[tuple[str, ...]] = ()  # `attnlab predict` options its predict takes by keyword
    # train.strategy pp: the model's method whose logits its loss reads ('forward', 'classify'),
    # which the last pipeline stage ends with, and ``piped`` its batches; None: not pipelined
    pipeline_head: ClassVar[str | None] = None

    @classmethod
    def piped(cls, batch: Any) -> Piped:
        """``batch`` as the pipeline's stages read it (where ``pipeline_head`` is set)."""
        raise NotImplementedError

    @classmethod
    def class_names(cls, run: Any, **options: str) -> list[str]:
        """The names of the classes ``predict`` gives probabilities of, in order: the run's labels;
        ``options``: those of ``predict_options`` given (a zero-shot classifier's own classes)."""
        return run.read_task_state()["labels"]

    @classmethod
    def fits(cls, capabilities: Capabilities) -> bool:
        needs = {"inputs": Inputs.TOKENS} | cls.needs
        return all(getattr(capabilities, k) == v for k, v in needs.items())

    @classmethod
    def prepare(cls, cfg: Any, batching: Batching, tokenizers: Tokenizers | None = None,
                state: dict[str, Any] | None = None) -> TaskData:
        """Read the data; fit the tokenizers on the training split, or use the run's ``tokenizers``
        and ``state`` (what :meth:`saved_state` gave when the run was made)."""
        raise NotImplementedError

    @classmethod
    def saved_state(cls, data: Any) -> dict[str, Any]:
        """What else a run keeps of its data, as JSON values (a classifier's labels); {} for none."""
        return {}

    @classmethod
    def data_shape(cls, cfg: Any, data: Any = None) -> DataShape:
        """The sizes the task's data gives a model, the one declaration of them: without ``data``,
        what the config ``cfg`` alone tells (`attnlab info`, a sweep's planning, the run config's
        checks), a vocabulary as None (only the fitted tokenizer knows it:
        :meth:`DataShape.with_vocabulary`); with the prepared ``data``, every size. By default one
        vocabulary's, the tokenizer of the first role the task saves."""
        return DataShape(vocab_size=cls.vocabulary(data, cls.tokenizers[0]), pad_id=PAD)

    @classmethod
    def vocabulary(cls, data: Any, role: str) -> int | None:
        """The vocabulary size of the prepared ``data``'s tokenizer of ``role``, one the task declares
        in ``tokenizers`` (it saves that tokenizer with a run); None without data."""
        if role not in cls.tokenizers:
            raise TypeError(f"task {cls.name!r} sets a vocabulary size from its {role!r} tokenizer: declare the "
                            f"roles of the tokenizers it saves (tokenizers = ('src',), ('tgt',) or ('src', 'tgt'))")
        return None if data is None else data.tokenizers[role].vocab_size

    @classmethod
    def loss(cls, model: nn.Module, batch: Any, label_smoothing: float, amp: Amp) -> tuple[torch.Tensor, torch.Tensor]:
        """(training loss, plain NLL), each summed over the batch's n_targets targets; the forward
        runs under ``amp``."""
        raise NotImplementedError

    @classmethod
    def validate(cls, model: nn.Module, data: Any, device: torch.device, amp: Amp, n_decoded: int,
                 split: str = "valid") -> dict[str, float]:
        """The metrics on ``split`` (``valid_loss`` always); ``n_decoded``: how many examples to
        predict for metrics that need predictions (train.eval_exact_match)."""
        raise NotImplementedError

    @classmethod
    def analysis_pass(cls, model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        """Run ``model`` on ``batch`` as validation does (for `inspect` and `prune`, which capture its
        attention); the real (non-padding) queries of each stack, (B, T) by 'encoder' / 'decoder'."""
        raise NotImplementedError

    @classmethod
    def report(cls, result: dict[str, Any], source: str) -> list[str]:
        """The lines `attnlab evaluate` prints for a record of ``evaluate_file`` or ``evaluate_split``
        of ``source`` (the file, or 'split NAME')."""
        raise NotImplementedError

    @classmethod
    def describe(cls, data: Any) -> str:
        """One line on the prepared data, for the training log."""
        raise NotImplementedError


class NextTokenTask(Task):
    """A task whose targets are tokens, each predicted from the true prefix (teacher forcing):
    translation, language modelling. Trained with the label-smoothed cross-entropy, validated by
    the NLL per target token and its perplexity."""

    @classmethod
    def loss(cls, model: nn.Module, batch: Any, label_smoothing: float, amp: Amp) -> tuple[torch.Tensor, torch.Tensor]:
        return teacher_forced_loss(model, batch, label_smoothing, amp)

    @classmethod
    def validate(cls, model: nn.Module, data: Any, device: torch.device, amp: Amp, n_decoded: int,
                 split: str = "valid") -> dict[str, float]:
        scores = evaluate(model, data.eval_batches(split), device, amp)
        return {"valid_loss": scores["loss"], "valid_ppl": scores["ppl"]}

    @classmethod
    def analysis_pass(cls, model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        logits_of(model, batch)
        return {"encoder": batch.src != PAD if batch.src is not None else batch.tgt_in != PAD,
                "decoder": batch.tgt_in != PAD}


TASKS: dict[str, type[Task]] = {}
DEFAULT_TASK = "translation"

# The fields of the one flat DataConfig of release 0.1: a run directory written then lists all of
# them, for every format, and names the generator 'task'. Reading such a file drops those the task
# does not have (its reader never used them).
RELEASE_0_1_FIELDS = (
    "format", "task", "train", "valid", "test", "src_lang", "tgt_lang", "tokenizer", "vocab_size", "shared_vocab",
    "max_src_len", "max_tgt_len", "seed", "n_train", "n_valid", "n_test", "min_len", "max_len", "block_size",
    "valid_fraction")


def register_task(task: type[Task]) -> type[Task]:
    """Class decorator: make ``task`` selectable as ``data.task: <task.name>``; what it ``needs`` of a
    family is checked against :class:`Capabilities` here, and that a task declaring no tokenizer
    says which sizes its data gives (the default :meth:`Task.data_shape` is the vocabulary of its
    first tokenizer); a vocabulary size taken from a tokenizer it does not declare is
    refused where the fields are first planned (:meth:`Task.vocabulary`)."""
    task.needs = Capabilities.check_needs(task.needs)
    if not task.tokenizers and task.data_shape.__func__ is Task.data_shape.__func__:
        raise TypeError(f"task {task.name!r} declares no tokenizer, so its data sets no vocabulary: define its "
                        f"data_shape(cfg, data=None), or declare the roles of the tokenizers it saves "
                        f"(tokenizers = ('src',), ('tgt',) or ('src', 'tgt'))")
    return register(TASKS, task, "task")


def task_named(name: Any) -> type[Task]:
    """The registered task that ``data.task`` names; an unknown name is a ConfigError listing them."""
    if name in GENERATORS:  # release 0.1 named the generator data.task
        raise ConfigError(f"data.task names the task ({', '.join(map(repr, TASKS))}); '{name}' is a built-in "
                          f"generator: write `generator: {name}` (with format: builtin)")
    one_of("data.task", name, TASKS)
    return TASKS[name]


def task_of(data: Mapping[str, Any]) -> type[Task]:
    """The task a data section names, or, without data.task, the first whose formats include its
    data.format (the default task without either)."""
    if "task" in data:
        return task_named(data["task"])
    return next((task for task in TASKS.values() if data.get("format") in task.formats), TASKS[DEFAULT_TASK])


def task_config(data: Any, from_0_1: bool = False) -> TaskConfig:
    """The data section as its task's config. ``from_0_1``: a run directory's config.yaml, which
    release 0.1 wrote with every field and the generator as 'task' (see :func:`written_by_0_1`)."""
    if not isinstance(data, dict):
        raise ConfigError(f"section 'data' must be a mapping of field: value (got {type(data).__name__})")
    if from_0_1:
        data = written_by_0_1(data)
    return task_of(data).config.from_dict(data)


def written_by_0_1(data: dict[str, Any]) -> dict[str, Any]:
    """A run directory's data section as this release reads it: written by 0.1 (data.task names a
    generator), the generator moves to data.generator and the fields the task does not have go;
    a newer section is unchanged."""
    if data.get("task") not in GENERATORS:
        return data
    generator = data["task"]
    data = {k: v for k, v in data.items() if k != "task"}
    own = task_of(data).config.field_names()
    data = {k: v for k, v in data.items() if k in own or k not in RELEASE_0_1_FIELDS}
    return data | {"generator": generator} if "generator" in own else data
