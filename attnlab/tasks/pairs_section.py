"""The parts of a data section of sentence pairs (translation's, and so masked_translation's): the
built-in generator (PairGenerator: ``data.generator``) and the pairs' two sides (Pairs: ``data.pairs``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from attnlab.config import TypedConfig, at_least, one_of
from attnlab.data.corpora import GENERATORS
from attnlab.data.scan import SCAN_SPLITS
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class PairGenerator(TypedConfig):
    """The built-in generator of sentence pairs (``data.generator``, read with ``format: builtin``):
    ``name`` (scan, copy, reverse, sort, addition); ``min_len`` / ``max_len``, the lengths of a
    sequence generator's pairs (digits per number for addition); ``test_min_len`` / ``test_max_len``,
    where given, the test split's lengths instead, to measure generalisation beyond the training
    lengths; ``split``, with scan, one of SCAN's generalisation splits (data/scan.py: simple, length,
    add_prim_jump, ...) in place of a random cut."""

    section: ClassVar[str] = "data.generator"

    name: str = "scan"
    min_len: int = 3
    max_len: int = 12
    test_min_len: Optional[int] = None
    test_max_len: Optional[int] = None
    split: Optional[str] = None

    def check(self) -> None:
        one_of("generator.name", self.name, GENERATORS)
        at_least("generator.min_len", self.min_len, 1)
        if self.max_len < self.min_len:
            raise ConfigError(f"generator.max_len ({self.max_len}) must be >= generator.min_len ({self.min_len})")
        if self.split is not None:
            if self.name != "scan":
                raise ConfigError(f"generator.split is one of SCAN's splits: it needs name 'scan' (got '{self.name}')")
            one_of("generator.split", self.split, SCAN_SPLITS)
        if self.test_lengths is not None:
            if self.name == "scan":
                raise ConfigError(
                    "generator.test_min_len / test_max_len set the test lengths of a sequence generator (copy, "
                    "reverse, sort, addition), not of 'scan'"
                )
            low, high = self.test_lengths
            at_least("generator.test_min_len", low, 1)
            if high < low:
                raise ConfigError(f"generator.test_max_len ({high}) must be >= generator.test_min_len ({low})")

    @property
    def test_lengths(self) -> tuple[int, int] | None:
        """The test split's (lowest, highest) length, where it differs from the training lengths'."""
        if self.test_min_len is None and self.test_max_len is None:
            return None
        return (
            self.min_len if self.test_min_len is None else self.test_min_len,
            self.max_len if self.test_max_len is None else self.test_max_len,
        )


@dataclass(frozen=True)
class Pairs(TypedConfig):
    """The two sides of the sentence pairs (``data.pairs``): ``src_lang`` / ``tgt_lang``, the file
    suffixes of format parallel (``{train,valid,test}.{src_lang,tgt_lang}``); ``max_src_len`` /
    ``max_tgt_len``, the longest source and target kept in training (tokens); ``shared_vocab``, one
    tokenizer fitted on both sides, else one per side."""

    section: ClassVar[str] = "data.pairs"

    src_lang: Optional[str] = None
    tgt_lang: Optional[str] = None
    max_src_len: int = 256
    max_tgt_len: int = 256
    shared_vocab: bool = True

    def check(self) -> None:
        for name in ("max_src_len", "max_tgt_len"):
            at_least(f"pairs.{name}", getattr(self, name), 1)
