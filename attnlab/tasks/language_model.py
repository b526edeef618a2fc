"""Language modelling: predict each next token of a plain text, trained on random windows,
validated by loss and perplexity, used by `generate` and `score`."""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Protocol, Sequence

import torch

from attnlab.config import TypedConfig, at_least, flattened, one_of
from attnlab.data.batching import Batch, lm_blocks, lm_eval_blocks
from attnlab.data.corpora import read_text
from attnlab.data.tokenizers import PAD, Tokenizer
from attnlab.errors import ConfigError, DataError
from attnlab.eval.likelihood import multi_token_loss
from attnlab.tasks.abilities import Piped
from attnlab.tasks.batching import Batching, Tokenizers, batch_seed
from attnlab.tasks.parts import Files, Splits, Text
from attnlab.tasks.task import Amp, NextTokenTask, TaskConfig, register_task


@dataclass(frozen=True)
class Windows(TypedConfig):
    """The windows a running text's token stream is cut into, ``block_size`` tokens each (a language
    model's random training windows and its evaluation windows, Transformer-XL's segments): written in
    the data section itself (``data.block_size``: a task composes this part with config.flattened,
    giving its own default)."""

    section: ClassVar[str] = "data"

    block_size: int

    def check(self) -> None:
        at_least("block_size", self.block_size, 1)


class RunningTextSection(Protocol):
    """What a data section of running text offers (language_model's, segment_language_model's): the
    text's files, its ``text``, ``splits`` and ``windows`` parts (tasks/parts.py, Windows here); each
    declares them beside its own fields, and the functions here read it."""

    @property
    def files(self) -> Files: ...
    @property
    def text(self) -> Text: ...
    @property
    def windows(self) -> Windows: ...
    @property
    def splits(self) -> Splits: ...


TEXT_SPLITS = Splits(valid_fraction=0.1)  # a running text's: the last tenth validates
TEXT_SPLITS_READ = ("valid_fraction",)
TEXT_FILES = ("format", "train", "valid")  # a running text's: no test file


def check_running_text(cfg: RunningTextSection, task: str) -> None:
    one_of("format", cfg.files.format, LanguageModel.formats)
    cfg.splits.read_by(task, TEXT_SPLITS_READ)
    cfg.splits.given(*TEXT_SPLITS_READ)


def check_running_text_trainable(cfg: RunningTextSection) -> None:
    """A run imported from Hugging Face (interop/) has no training text; training needs one."""
    if cfg.files.train is None:
        raise ConfigError(f"format '{cfg.files.format}' needs 'train' (a file)")


@dataclass(frozen=True)
class LanguageModelConfig(TaskConfig):
    """Plain text for a language model (``format: text``): the last ``splits.valid_fraction`` of
    ``train`` is validation unless a ``valid`` file is given; tokenised as ``text`` says; windows of
    ``block_size`` tokens (Windows, written flat)."""

    files: Files = flattened(Files(format="text"), TEXT_FILES)
    text: Text = Text()
    splits: Splits = TEXT_SPLITS
    windows: Windows = flattened(Windows(block_size=64))
    splits_read = TEXT_SPLITS_READ

    def check(self) -> None:
        check_running_text(self, self.chosen_name())

    def check_trainable(self) -> None:
        check_running_text_trainable(self)

    @property
    def longest_sequence(self) -> int:
        return self.windows.block_size


class RandomWindows(Sequence[Batch]):
    """A virtual epoch of random windows; batch k of epoch e depends only on (seed, e, k). ``draw``
    makes a batch of windows of block_size trained tokens from a generator."""

    def __init__(
        self,
        data: torch.Tensor,
        block_size: int,
        batch_size: int,
        seed: int,
        epoch: int,
        draw: Callable[[torch.Tensor, int, int, torch.Generator], Batch] = lm_blocks,
    ) -> None:
        self.data, self.block_size, self.batch_size, self.seed, self.epoch = data, block_size, batch_size, seed, epoch
        self.draw = draw
        self.n = max(1, len(data) // (block_size * batch_size))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> Batch:  # type: ignore[override]
        if not 0 <= k < self.n:
            raise IndexError(k)
        g = torch.Generator().manual_seed(batch_seed(self.seed, self.epoch, k))
        return self.draw(self.data, self.block_size, self.batch_size, g)


@dataclass
class LMData:
    tokenizers: Tokenizers
    splits: dict[str, torch.Tensor]  # split -> (N,) token ids
    block_size: int = 64
    batch_size: int = 32
    seed: int = 0
    _eval: dict[str, Sequence[Batch]] = field(default_factory=dict, repr=False)

    def epoch_batches(self, epoch: int) -> Sequence[Batch]:
        return RandomWindows(self.splits["train"], self.block_size, self.batch_size, self.seed, epoch)

    def eval_batches(self, split: str) -> Sequence[Batch]:
        """Every full window of a split, in order (made once)."""
        if split not in self._eval:
            self._eval[split] = lm_eval_blocks(self.splits[split], self.block_size, self.batch_size)
        return self._eval[split]


TextData = typing.TypeVar("TextData", bound=LMData)
TextBatch = typing.TypeVar("TextBatch", bound=Batch)


class RunningText(NextTokenTask[TextData, TextBatch]):
    """What every language model of a plain text does (language_model, segment_language_model):
    read the text, fit its tokenizer, and lay the token stream out as its ``layout`` batches it."""

    needs = {"encoder": False, "decoder": True}
    metrics = {"valid_loss": True, "valid_ppl": True}
    tokenizers = ("tgt",)
    layout: ClassVar[type[LMData]] = LMData  # how the splits become batches

    @property
    def section(self) -> RunningTextSection:
        """The task's data section, one of running text (a LanguageModelConfig or SegmentLanguageModelConfig)."""
        return typing.cast(RunningTextSection, self.cfg)

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, typing.Any] | None = None
    ) -> TextData:
        cfg = self.section
        text = read_text(typing.cast(str, cfg.files.train))  # given: check_trainable
        if cfg.files.valid is not None:
            train_text, valid_text = text, read_text(cfg.files.valid)
        else:
            cut = math.floor(len(text) * (1.0 - (cfg.splits.valid_fraction or 0.0)))  # given: check_running_text
            train_text, valid_text = text[:cut], text[cut:]
        if tokenizers is None:
            lines = train_text.splitlines(keepends=True)
            tokenizers = {"src": None, "tgt": cfg.text.fitted(lines)}
        tok = typing.cast(Tokenizer, tokenizers["tgt"])  # the task's own role: never None
        splits = {
            name: torch.tensor(tok.encode(t), dtype=torch.long)
            for name, t in (("train", train_text), ("valid", valid_text))
        }
        for name, stream in splits.items():
            if len(stream) <= cfg.windows.block_size:
                where = cfg.files.valid if name == "valid" and cfg.files.valid is not None else cfg.files.train
                raise DataError(
                    f"{where}: the {name} text has {len(stream)} tokens, fewer than data.block_size + 1 "
                    f"({cfg.windows.block_size + 1})"
                )
        return typing.cast(
            TextData, self.layout(tokenizers, splits, cfg.windows.block_size, batching.batch_size, batching.seed)
        )

    def loss(
        self, model: torch.nn.Module, batch: TextBatch, label_smoothing: float, amp: Amp
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The next-token loss, plus the multi-token heads' where the model has them."""
        return multi_token_loss(model, batch, label_smoothing, amp)

    def describe(self, data: TextData) -> str:
        sizes = ", ".join(f"{name} {len(s):,} tokens" for name, s in data.splits.items())
        return f"language-model text: {sizes}; vocabulary {typing.cast(Tokenizer, data.tokenizers['tgt']).vocab_size}"


@register_task
class LanguageModel(RunningText[LMData, Batch]):
    """Next-token prediction over running text (data.task: language_model), scored by loss and perplexity;
    generates continuations."""

    name = "language_model"
    config = LanguageModelConfig
    cfg: LanguageModelConfig
    formats = ("text",)
    commands = ("generate", "score", "inspect", "prune")
    pipeline_head = "forward"

    def piped(self, batch: Batch) -> Piped:
        return Piped((batch.tgt_in,), batch.tgt_out, PAD)
