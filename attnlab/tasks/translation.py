"""Translation: a source sentence to a target sentence, read from parallel files, TSV, SCAN's
format or a built-in generator, trained by teacher forcing, validated by loss and exact match,
used by `translate`, `evaluate` and `score`."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field

import torch
from torch import nn

from attnlab.config import flattened, one_of
from attnlab.data.batching import Batch, collate_pairs
from attnlab.data.corpora import (
    FilterReport,
    Pair,
    filter_by_length,
    generated_pairs,
    read_parallel,
    read_scan,
    read_tsv,
)
from attnlab.data.tokenizers import PAD, Tokenizer
from attnlab.decode.spec import Greedy, Search
from attnlab.decode.translate import translate
from attnlab.errors import ConfigError, DataError
from attnlab.eval.metrics import exact_match
from attnlab.models.shape import DataShape
from attnlab.tasks.abilities import Piped
from attnlab.tasks.batching import Batch as TaskBatch
from attnlab.tasks.batching import Batching, BucketedData, Tokenizers, hold_out_valid
from attnlab.tasks.pairs_section import PairGenerator, Pairs
from attnlab.tasks.parts import Files, Splits, Text
from attnlab.tasks.task import Amp, NextTokenTask, Task, TaskConfig, register_task


@dataclass(frozen=True)
class TranslationConfig(TaskConfig):
    """Where the sentence pairs come from and how they become token ids.

    ``format``: ``builtin`` (pairs made by the ``generator``: its name, scan, copy, reverse, sort or
    addition, and its lengths), ``parallel`` (``{train,valid,test}.{src_lang,tgt_lang}`` line-aligned
    files, the suffixes ``pairs.src_lang`` / ``pairs.tgt_lang``), ``tsv`` (source TAB target) or
    ``scan`` (``IN: ... OUT: ...`` lines). Without a ``valid`` file the last ``n_valid`` training
    pairs are held out. Relative paths are taken from the current directory. ``n_train``: how many
    training pairs to use (a generator's count; of a file, the first ones); ``seed``, the
    generator's. ``pairs``: the sides' suffixes, longest sentences and vocabularies; ``text``: the
    tokenizer (tasks/parts.py).
    """

    files: Files = flattened(Files(format="builtin"))
    generator: PairGenerator = PairGenerator()
    pairs: Pairs = Pairs()
    text: Text = Text()
    splits: Splits = flattened(Splits(seed=1234, n_valid=500, n_test=1000), ("seed", "n_train", "n_valid", "n_test"))

    def check_trainable(self) -> None:
        if self.files.format != "builtin" and self.files.train is None:  # a run imported from Marian reads none
            raise ConfigError(f"format '{self.files.format}' needs 'train' (a file, or a path prefix for 'parallel')")

    def check(self) -> None:
        """The checks across a section of sentence pairs' fields and parts."""
        one_of("format", self.files.format, Translation.formats)
        if self.generator.split is not None and self.files.format != "builtin":
            raise ConfigError(
                f"generator.split is one of SCAN's splits: it needs format 'builtin' (got '{self.files.format}')"
            )
        if self.generator.test_lengths is not None and self.files.format != "builtin":
            raise ConfigError(
                f"generator.test_min_len / test_max_len set the test lengths of a sequence generator, not of format "
                f"'{self.files.format}'"
            )
        # SCAN's grammar has its pairs; another generator draws as many as n_train says
        if self.files.format == "builtin" and self.generator.name != "scan" and self.splits.n_train is None:
            raise ConfigError(
                f"generator '{self.generator.name}' draws its pairs: set n_train, how many training pairs to draw"
            )
        if self.files.format == "parallel" and (self.pairs.src_lang is None or self.pairs.tgt_lang is None):
            raise ConfigError(
                "format 'parallel' needs pairs.src_lang and pairs.tgt_lang (file suffixes, e.g. 'de' and 'en')"
            )
        self.splits.given("seed", "n_valid", "n_test")

    @property
    def longest_sequence(self) -> int:
        return max(self.pairs.max_src_len, self.pairs.max_tgt_len) + 1  # + EOS (source) or BOS (target input)

    @property
    def in_memory(self) -> bool:
        return self.files.format == "builtin"


@dataclass
class Example:
    """One sentence pair, as text and as token ids (without BOS/EOS)."""

    src: str
    tgt: str
    src_ids: list[int]
    tgt_ids: list[int]


PairsBatch = typing.TypeVar("PairsBatch", bound=TaskBatch)


@dataclass(kw_only=True)
class SentencePairs(BucketedData[Example, PairsBatch]):
    """Sentence pairs per split, and the length filter's report of the training split; how a group
    of them becomes a batch is the layout's (:class:`Seq2SeqData`, masked_translation's MaskedPairs)."""

    splits: dict[str, list[Example]]
    reports: dict[str, FilterReport] = field(default_factory=dict)

    def length(self, example: Example) -> int:
        return max(len(example.src_ids), len(example.tgt_ids)) + 1  # + EOS or BOS


@dataclass(kw_only=True)
class Seq2SeqData(SentencePairs[Batch]):
    """Sentence pairs batched for teacher forcing: source, and the target shifted in and out."""

    def collate(self, examples: list[Example], seed: int) -> Batch:
        return collate_pairs([(e.src_ids, e.tgt_ids) for e in examples])


def read_pairs(cfg: TranslationConfig) -> dict[str, list[Pair]]:
    """The configured corpus as text pairs per split; a missing valid split is the last n_valid
    training pairs; with ``n_train``, only the first n_train of the (remaining) training pairs
    are kept (data-size curves)."""
    if cfg.files.format == "builtin":
        return generated_pairs(
            cfg.generator.name,
            cfg.splits.seed or 0,  # seed, n_valid, n_test: given (TranslationConfig.check)
            cfg.splits.n_train,
            cfg.splits.n_valid or 0,
            cfg.splits.n_test or 0,
            cfg.generator.min_len,
            cfg.generator.max_len,
            cfg.generator.split,
            cfg.generator.test_lengths,
        )

    def read(path: str) -> list[Pair]:
        if cfg.files.format == "parallel":
            return read_parallel(f"{path}.{cfg.pairs.src_lang}", f"{path}.{cfg.pairs.tgt_lang}")
        return read_tsv(path) if cfg.files.format == "tsv" else read_scan(path)

    splits = {name: read(path) for name, path in cfg.files.given()}
    splits = hold_out_valid(splits, cfg.splits.n_valid or 0, cfg.files.train, "pairs")
    if cfg.splits.n_train is not None:
        splits["train"] = splits["train"][: cfg.splits.n_train]
    return splits


VALIDATION_SEARCH = Greedy(batch_size=128)  # what validation decodes a split with


def decode_split(
    model: nn.Module,
    data: SentencePairs[typing.Any],
    split: str,
    limit: int | None = None,
    search: Search = VALIDATION_SEARCH,
    progress: bool = False,
) -> list[tuple[str, str, str]]:
    """Translations by ``search`` (default greedy; a conditional masked language model's by
    mask-predict) of the first ``limit`` examples of a split: (source, reference, output);
    ``progress`` shows translate's progress bar."""
    examples = data.splits[split][:limit]
    outputs = translate(model, data.tokenizers, [e.src for e in examples], search, progress=progress)
    return [(e.src, e.tgt, hyps[0][0]) for e, hyps in zip(examples, outputs)]


PairsData = typing.TypeVar("PairsData", bound=SentencePairs[typing.Any])


class ParallelText(Task[PairsData, PairsBatch]):
    """What every task of sentence pairs does (translation, masked translation): read them with
    their tokenizers into the task's ``layout``, one vocabulary per side or one shared."""

    needs = {"encoder": True, "decoder": True}
    tokenizers = ("src", "tgt")
    layout: typing.ClassVar[type[SentencePairs[typing.Any]]] = Seq2SeqData  # how the pairs are batched
    with_mask: typing.ClassVar[bool] = False  # tokenizers with <mask> (id 4)

    @property
    def section(self) -> TranslationConfig:
        """The task's data section, one of sentence pairs (a TranslationConfig or MaskedTranslationConfig)."""
        return typing.cast(TranslationConfig, self.cfg)

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, typing.Any] | None = None
    ) -> PairsData:
        cfg = self.section
        splits = read_pairs(cfg)
        if tokenizers is None:
            train = splits["train"]
            if cfg.pairs.shared_vocab:
                shared = self.tokenizer([s for s, _ in train] + [t for _, t in train])
                tokenizers = {"src": shared, "tgt": shared}
            else:
                tokenizers = {
                    "src": self.tokenizer([s for s, _ in train]),
                    "tgt": self.tokenizer([t for _, t in train]),
                }
        encoded: dict[str, list[Example]] = {}
        reports: dict[str, FilterReport] = {}
        for name, pairs in splits.items():
            # the task's own roles: never None
            src_ids = typing.cast(Tokenizer, tokenizers["src"]).encode_batch([s for s, _ in pairs])
            tgt_ids = typing.cast(Tokenizer, tokenizers["tgt"]).encode_batch([t for _, t in pairs])
            examples = [Example(s, t, si, ti) for (s, t), si, ti in zip(pairs, src_ids, tgt_ids)]
            if name == "train":  # evaluation sets are never filtered: scores must cover every sentence
                keep, reports[name] = filter_by_length(
                    list(zip(src_ids, tgt_ids)), cfg.pairs.max_src_len, cfg.pairs.max_tgt_len
                )
                examples = [examples[i] for i in keep]
                if not examples:
                    raise DataError(f"no training pairs left after length filtering ({reports[name]})")
            encoded[name] = examples
        return typing.cast(
            PairsData, self.layout(tokenizers=tokenizers, splits=encoded, reports=reports, **batching.bucketing())
        )

    def tokenizer(self, lines: list[str]) -> Tokenizer:
        """A tokenizer as data.text says, fitted on ``lines``."""
        return self.section.text.fitted(lines, self.with_mask)

    def data_shape(self, data: PairsData | None = None) -> DataShape:
        """The target's vocabulary size; the source's as src_vocab_size, None when shared (the model
        reads it as the target's)."""
        return DataShape(
            vocab_size=self.vocabulary(data, "tgt"),
            pad_id=PAD,
            src_vocab_size=None if self.section.pairs.shared_vocab else self.vocabulary(data, "src"),
        )

    def describe(self, data: PairsData) -> str:
        sizes = ", ".join(f"{name} {len(e):,}" for name, e in data.splits.items())
        # the task's own roles: never None
        src, tgt = typing.cast(Tokenizer, data.tokenizers["src"]), typing.cast(Tokenizer, data.tokenizers["tgt"])
        vocab = (
            f"shared vocabulary {tgt.vocab_size}" if src is tgt else f"vocabularies {src.vocab_size} / {tgt.vocab_size}"
        )
        report = f"; train filter: {data.reports['train']}" if "train" in data.reports else ""
        return f"pairs: {sizes}; {vocab}{report}"


@register_task
class Translation(NextTokenTask[Seq2SeqData, Batch], ParallelText[Seq2SeqData, Batch]):
    """Sequence to sequence: a source line in, its target line out (data.task: translation), scored by
    loss, perplexity and exact match (BLEU: `attnlab evaluate`); decoded by greedy, beam or sampling search."""

    name = "translation"
    config = TranslationConfig
    cfg: TranslationConfig
    formats = ("builtin", "parallel", "tsv", "scan")
    metrics = {"valid_loss": True, "valid_ppl": True, "exact_match": False}
    commands = ("translate", "evaluate", "score", "inspect", "prune")
    pipeline_head = "forward"

    def piped(self, batch: Batch) -> Piped:
        return Piped((typing.cast(torch.Tensor, batch.src), batch.tgt_in), batch.tgt_out, PAD)

    def validate(
        self, model: nn.Module, data: Seq2SeqData, device: torch.device, amp: Amp, n_decoded: int, split: str = "valid"
    ) -> dict[str, float]:
        """Loss and perplexity, and the exact match of ``n_decoded`` greedy translations."""
        result = super().validate(model, data, device, amp, n_decoded, split)
        if n_decoded:
            triples = decode_split(model, data, split, n_decoded)
            result["exact_match"] = exact_match([h for _, _, h in triples], [r for _, r, _ in triples])
        return result
