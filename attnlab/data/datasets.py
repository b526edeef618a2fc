"""From a DataConfig to ready batches: read the corpus, fit (or reuse) the tokenizers, encode,
filter by length, and serve reproducible batches for any (epoch, position)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from attnlab.data.batching import Batch, collate_pairs, lm_blocks, lm_eval_blocks, token_budget_batches
from attnlab.data.config import DataConfig
from attnlab.data.corpora import (
    FilterReport,
    Pair,
    builtin_task,
    filter_by_length,
    read_parallel,
    read_scan,
    read_text,
    read_tsv,
)
from attnlab.data.tokenizers import Tokenizer
from attnlab.errors import DataError

Tokenizers = dict[str, "Tokenizer | None"]


@dataclass
class Example:
    """One sentence pair, as text and as token ids (without BOS/EOS)."""

    src: str
    tgt: str
    src_ids: list[int]
    tgt_ids: list[int]


@dataclass
class Seq2SeqData:
    tokenizers: Tokenizers
    splits: dict[str, list[Example]]
    reports: dict[str, FilterReport] = field(default_factory=dict)
    seed: int = 0
    max_tokens: int = 4096

    def epoch_batches(self, epoch: int) -> list[Batch]:
        """The training batches of ``epoch``: the same for the same (seed, epoch), so a resumed run
        continues exactly where it stopped."""
        train = self.splits["train"]
        lengths = [max(len(e.src_ids), len(e.tgt_ids)) + 1 for e in train]
        groups = token_budget_batches(lengths, self.max_tokens, self.seed, epoch)
        return [collate_pairs([(train[i].src_ids, train[i].tgt_ids) for i in g]) for g in groups]

    def eval_batches(self, split: str) -> list[Batch]:
        examples = self.splits[split]
        lengths = [max(len(e.src_ids), len(e.tgt_ids)) + 1 for e in examples]
        groups = token_budget_batches(lengths, self.max_tokens, seed=0, epoch=0)
        return [collate_pairs([(examples[i].src_ids, examples[i].tgt_ids) for i in g]) for g in groups]


class _LMEpoch(Sequence[Batch]):
    """A virtual epoch of random LM windows; batch k of epoch e depends only on (seed, e, k)."""

    def __init__(self, data: torch.Tensor, block_size: int, batch_size: int, seed: int, epoch: int) -> None:
        self.data, self.block_size, self.batch_size, self.seed, self.epoch = data, block_size, batch_size, seed, epoch
        self.n = max(1, len(data) // (block_size * batch_size))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> Batch:  # type: ignore[override]
        if not 0 <= k < self.n:
            raise IndexError(k)
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) * 1_000_033 + k)
        return lm_blocks(self.data, self.block_size, self.batch_size, g)


@dataclass
class LMData:
    tokenizers: Tokenizers
    streams: dict[str, torch.Tensor]  # split -> (N,) token ids
    block_size: int = 64
    batch_size: int = 32
    seed: int = 0

    def epoch_batches(self, epoch: int) -> Sequence[Batch]:
        return _LMEpoch(self.streams["train"], self.block_size, self.batch_size, self.seed, epoch)

    def eval_batches(self, split: str) -> list[Batch]:
        return lm_eval_blocks(self.streams[split], self.block_size, self.batch_size)


def read_pairs(cfg: DataConfig) -> dict[str, list[Pair]]:
    """The configured corpus as text pairs per split; a missing valid split is the last n_valid
    training pairs."""
    if cfg.format == "builtin":
        return builtin_task(cfg.task, cfg.seed, cfg.n_train, cfg.n_valid, cfg.n_test, cfg.min_len, cfg.max_len)

    def read(path: str) -> list[Pair]:
        if cfg.format == "parallel":
            return read_parallel(f"{path}.{cfg.src_lang}", f"{path}.{cfg.tgt_lang}")
        return read_tsv(path) if cfg.format == "tsv" else read_scan(path)

    splits = {name: read(path) for name, path in (("train", cfg.train), ("valid", cfg.valid), ("test", cfg.test))
              if path is not None}
    if "valid" not in splits:
        if len(splits["train"]) <= cfg.n_valid:
            raise DataError(f"{cfg.train}: {len(splits['train'])} pairs are too few to hold out n_valid "
                            f"({cfg.n_valid}) for validation; give a 'valid' file")
        splits["train"], splits["valid"] = splits["train"][:-cfg.n_valid], splits["train"][-cfg.n_valid:]
    return splits


def prepare_seq2seq(cfg: DataConfig, max_tokens: int, seed: int, tokenizers: Tokenizers | None = None) -> Seq2SeqData:
    splits = read_pairs(cfg)
    if tokenizers is None:
        train = splits["train"]
        if cfg.shared_vocab:
            shared = Tokenizer.train(cfg.tokenizer, [s for s, _ in train] + [t for _, t in train], cfg.vocab_size)
            tokenizers = {"src": shared, "tgt": shared}
        else:
            tokenizers = {"src": Tokenizer.train(cfg.tokenizer, [s for s, _ in train], cfg.vocab_size),
                          "tgt": Tokenizer.train(cfg.tokenizer, [t for _, t in train], cfg.vocab_size)}
    encoded: dict[str, list[Example]] = {}
    reports: dict[str, FilterReport] = {}
    for name, pairs in splits.items():
        src_ids = tokenizers["src"].encode_batch([s for s, _ in pairs])
        tgt_ids = tokenizers["tgt"].encode_batch([t for _, t in pairs])
        examples = [Example(s, t, si, ti) for (s, t), si, ti in zip(pairs, src_ids, tgt_ids)]
        if name == "train":  # evaluation sets are never filtered: scores must cover every sentence
            keep, reports[name] = filter_by_length(list(zip(src_ids, tgt_ids)), cfg.max_src_len, cfg.max_tgt_len)
            examples = [examples[i] for i in keep]
            if not examples:
                raise DataError(f"no training pairs left after length filtering ({reports[name]})")
        encoded[name] = examples
    return Seq2SeqData(tokenizers, encoded, reports, seed=seed, max_tokens=max_tokens)


def prepare_lm(cfg: DataConfig, batch_size: int, seed: int, tokenizers: Tokenizers | None = None) -> LMData:
    text = read_text(cfg.train)
    if cfg.valid is not None:
        train_text, valid_text = text, read_text(cfg.valid)
    else:
        cut = math.floor(len(text) * (1.0 - cfg.valid_fraction))
        train_text, valid_text = text[:cut], text[cut:]
    if tokenizers is None:
        tokenizers = {"src": None, "tgt": Tokenizer.train(cfg.tokenizer, train_text.splitlines(keepends=True), cfg.vocab_size)}
    tok = tokenizers["tgt"]
    streams = {name: torch.tensor(tok.encode(t), dtype=torch.long) for name, t in (("train", train_text), ("valid", valid_text))}
    for name, stream in streams.items():
        if len(stream) <= cfg.block_size:
            where = cfg.valid if name == "valid" and cfg.valid is not None else cfg.train
            raise DataError(f"{where}: the {name} text has {len(stream)} tokens, fewer than data.block_size + 1 "
                            f"({cfg.block_size + 1})")
    return LMData(tokenizers, streams, cfg.block_size, batch_size, seed)


def prepare_data(cfg: DataConfig, max_tokens: int, batch_size: int, seed: int,
                 tokenizers: Tokenizers | None = None) -> Seq2SeqData | LMData:
    """Everything training needs from the data; pass the run's ``tokenizers`` to reuse them."""
    if cfg.is_lm:
        return prepare_lm(cfg, batch_size, seed, tokenizers)
    return prepare_seq2seq(cfg, max_tokens, seed, tokenizers)
