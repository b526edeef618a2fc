"""The data section of a config: where the text comes from and how it becomes token ids."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Optional

from attnlab.config import TypedConfig, at_least, one_of
from attnlab.data.corpora import BUILTIN_TASKS
from attnlab.data.tokenizers import TOKENIZER_KINDS
from attnlab.errors import ConfigError

DATA_FORMATS = ("builtin", "parallel", "tsv", "scan", "text")


@dataclass(frozen=True)
class DataConfig(TypedConfig):
    """Where the text comes from and how it becomes token ids.

    ``format``: ``builtin`` (a generated ``task``), ``parallel`` (``{train,valid,test}.{src_lang,tgt_lang}``
    line-aligned files), ``tsv`` (source TAB target), ``scan`` (``IN: ... OUT: ...`` lines) or ``text``
    (plain text for a language model; the last ``valid_fraction`` is validation unless ``valid`` is
    given). Relative paths are taken from the current directory.
    """

    section: typing.ClassVar[str] = "data"

    format: str = "builtin"
    task: Optional[str] = "scan"
    train: Optional[str] = None
    valid: Optional[str] = None
    test: Optional[str] = None
    src_lang: Optional[str] = None
    tgt_lang: Optional[str] = None
    tokenizer: str = "word"
    vocab_size: int = 8000
    shared_vocab: bool = True
    max_src_len: int = 256
    max_tgt_len: int = 256
    seed: int = 1234
    n_train: Optional[int] = None
    n_valid: int = 500
    n_test: int = 1000
    min_len: int = 3
    max_len: int = 12
    block_size: int = 64
    valid_fraction: float = 0.1

    def __post_init__(self) -> None:
        self._check_types()
        one_of("format", self.format, DATA_FORMATS)
        one_of("tokenizer", self.tokenizer, TOKENIZER_KINDS)
        if self.format == "builtin":
            one_of("task", self.task, BUILTIN_TASKS)
        elif self.train is None:
            raise ConfigError(f"format '{self.format}' needs 'train' (a file, or a path prefix for 'parallel')")
        if self.format == "parallel" and (self.src_lang is None or self.tgt_lang is None):
            raise ConfigError("format 'parallel' needs src_lang and tgt_lang (file suffixes, e.g. 'de' and 'en')")
        for name in ("vocab_size", "max_src_len", "max_tgt_len", "n_valid", "n_test", "min_len", "block_size"):
            at_least(name, getattr(self, name), 1)
        if self.n_train is not None:
            at_least("n_train", self.n_train, 1)
        if self.max_len < self.min_len:
            raise ConfigError(f"max_len ({self.max_len}) must be >= min_len ({self.min_len})")
        if not 0.0 < self.valid_fraction < 1.0:
            raise ConfigError(f"valid_fraction must be in (0, 1) (got {self.valid_fraction})")

    @property
    def is_lm(self) -> bool:
        return self.format == "text"
