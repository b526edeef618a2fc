"""Transformer-XL's language modelling (Dai et al. 2019): the language model's text read in
consecutive segments, the model's memory carried from one to the next, in evaluation always and in
training by default; or trained on random windows, each segment after a context read for its memory."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

from attnlab.config import at_least, flattened
from attnlab.data.batching import Batch, ContextSegmentBatch, SegmentBatch, lm_context_windows, lm_segments
from attnlab.data.corpora import read_text
from attnlab.data.tokenizers import PAD, Tokenizer
from attnlab.errors import DataError
from attnlab.eval.metrics import perplexity
from attnlab.models.family import unwrapped
from attnlab.models.shape import DataShape
from attnlab.nn.losses import label_smoothed_nll
from attnlab.nn.memory import SegmentMemory
from attnlab.tasks.batching import Batching, Tokenizers
from attnlab.tasks.language_model import (
    TEXT_FILES,
    TEXT_SPLITS,
    TEXT_SPLITS_READ,
    LMData,
    RandomWindows,
    RunningText,
    Windows,
    check_running_text,
    check_running_text_trainable,
)
from attnlab.tasks.parts import Files, Splits, Text
from attnlab.tasks.task import Amp, TaskConfig, register_task

if TYPE_CHECKING:
    from attnlab.nn.memory import TransformerXL


@dataclass
class SegmentData(LMData):
    """Transformer-XL's layout (batching.lm_segments): each split cut into batch_size rows, read in
    consecutive segments of block_size tokens. An epoch reads the training rows from their start,
    the memory empty at first. With ``context_segments`` k > 0, training reads random windows
    instead (batching.lm_context_windows): k segments of context, then the segment trained on."""

    context_segments: int = 0

    def epoch_batches(self, epoch: int) -> typing.Sequence[Batch]:
        if self.context_segments == 0:
            return lm_segments(self.splits["train"], self.block_size, self.batch_size)
        draw = functools.partial(lm_context_windows, context_segments=self.context_segments)
        return RandomWindows(self.splits["train"], self.block_size, self.batch_size, self.seed, epoch, draw)

    def eval_batches(self, split: str) -> list[SegmentBatch]:
        if split not in self._eval:
            self._eval[split] = lm_segments(self.splits[split], self.block_size, self.batch_size)
        return cast(list[SegmentBatch], self._eval[split])  # made by lm_segments above


@dataclass(frozen=True)
class SegmentLanguageModelConfig(TaskConfig):
    """The language model's data section's fields (tasks/language_model.py: a RunningTextSection), for
    data.task 'segment_language_model': ``block_size`` (its Windows part, written flat) is the segment
    length, which the model's segment_length takes. ``context_segments``: 0 (default) trains on
    consecutive segments, the memory carried from each batch to the next, as Dai et al.;
    k > 0 trains on random windows of k + 1 segments, the first k read with no gradient for the
    memory of the last, which alone is trained on (each update sees fresh places of the text, at
    the price of a forward pass over k segments)."""

    files: Files = flattened(Files(format="text"), TEXT_FILES)
    text: Text = Text()
    splits: Splits = TEXT_SPLITS
    windows: Windows = flattened(Windows(block_size=64))
    context_segments: int = 0
    splits_read = TEXT_SPLITS_READ

    def check(self) -> None:
        check_running_text(self, self.chosen_name())
        at_least("context_segments", self.context_segments, 0)

    def check_trainable(self) -> None:
        check_running_text_trainable(self)

    @property
    def longest_sequence(self) -> int:
        return self.windows.block_size


@register_task
class SegmentLanguageModel(RunningText[SegmentData, SegmentBatch | ContextSegmentBatch]):
    """Transformer-XL's language modelling (Dai et al. 2019): the text read by batch_size rows in
    consecutive segments, row i of batch k + 1 continuing row i of batch k, so that the memory the
    model leaves after one batch is the context of the next, in training as in evaluation (the
    memory of a segment's states holds no gradient). `attnlab evaluate` scores the run's split
    (--split) or a text file read in one row (--data); `generate` carries the memory in its cache."""

    name = "segment_language_model"
    config = SegmentLanguageModelConfig
    cfg: SegmentLanguageModelConfig
    needs = {"encoder": False, "decoder": True, "inputs": "token_segments"}
    commands = ("generate", "evaluate")
    layout = SegmentData

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, typing.Any] | None = None
    ) -> SegmentData:
        data = super().prepare(batching, tokenizers, state)
        window = (self.cfg.context_segments + 1) * self.cfg.windows.block_size
        if self.cfg.context_segments and len(data.splits["train"]) <= window:
            raise DataError(
                f"{self.cfg.files.train}: the train text has {len(data.splits['train'])} tokens, fewer than a "
                f"window of (data.context_segments + 1) x data.block_size + 1 ({window + 1})"
            )
        data.context_segments = self.cfg.context_segments
        return data

    def data_shape(self, data: SegmentData | None = None) -> DataShape:
        return dataclasses.replace(super().data_shape(data), segment_length=self.cfg.windows.block_size)

    def loss(
        self, model: torch.nn.Module, batch: SegmentBatch | ContextSegmentBatch, label_smoothing: float, amp: Amp
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The next-token loss of a segment read after its memory: the one its rows' previous segment
        left (an empty one when that was not the batch before), which moves on past it; or, for
        random windows, the one its context leaves, read with no gradient."""
        if isinstance(batch, ContextSegmentBatch):
            memory = SegmentMemory()
            with torch.no_grad(), amp():
                cast("TransformerXL", unwrapped(model)).states(batch.context, memory=memory)  # the task's model
        else:
            carried = batch.rows.carried(batch.index)
            memory = SegmentMemory() if carried is None else carried
        with amp():
            logits = model(batch.tgt_in, memory=memory)
        if isinstance(batch, SegmentBatch):
            batch.rows.keep(batch.index, memory)
        return label_smoothed_nll(logits, batch.tgt_out, label_smoothing, PAD)

    def validate(
        self,
        model: torch.nn.Module,
        data: SegmentData,
        device: torch.device,
        amp: Amp,
        n_decoded: int,
        split: str = "valid",
    ) -> dict[str, float]:
        scores = self.segments_nll(model, data.eval_batches(split), device, amp)
        return {"valid_loss": scores["loss"], "valid_ppl": scores["ppl"]}

    @torch.no_grad()
    def segments_nll(
        self,
        model: torch.nn.Module,
        batches: list[SegmentBatch],
        device: torch.device,
        amp: Amp = contextlib.nullcontext,
    ) -> dict[str, typing.Any]:
        """NLL per token and perplexity of consecutive segments, each read after the memory of those
        before it, as in training."""
        model.eval()
        nll_sum, n_tokens = 0.0, 0
        for batch in batches:
            batch = cast(SegmentBatch, batch.to(device))  # moved: a copy of the same class
            nll_sum += self.loss(model, batch, 0.0, amp)[1].item()
            n_tokens += batch.n_targets
        loss = nll_sum / max(n_tokens, 1)
        xl = unwrapped(model)
        return {
            "loss": loss,
            "ppl": perplexity(loss),
            "tokens": n_tokens,
            "rows": batches[0].tgt_in.shape[0],
            "segment_length": xl.segment_length,
            "memory_length": xl.memory_length,
        }

    def evaluate_split(self, model: torch.nn.Module, data: SegmentData, split: str) -> dict[str, typing.Any]:
        return self.segments_nll(model, data.eval_batches(split), next(model.parameters()).device)

    def evaluate_file(
        self, model: torch.nn.Module, tokenizers: Tokenizers, state: dict[str, typing.Any], path: str, split: str | None
    ) -> dict[str, typing.Any]:
        """The text of ``path`` read in one row of consecutive segments: every segment after the first
        has its memory."""
        self.refuse_split(split)
        tgt = cast(Tokenizer, tokenizers["tgt"])  # the task's own role: never None
        stream = torch.tensor(tgt.encode(read_text(path)), dtype=torch.long)
        if len(stream) < 2:
            raise DataError(f"{path}: {len(stream)} tokens; scoring needs at least two (a token and the next)")
        batches = lm_segments(
            stream, cast("TransformerXL", unwrapped(model)).segment_length, rows=1
        )  # the task's model
        return self.segments_nll(model, batches, next(model.parameters()).device)

    def report(self, result: dict[str, typing.Any], source: str) -> list[str]:
        return [
            f"perplexity {result['ppl']:.4g}: {result['loss']:.4f} nats per token over {result['tokens']:,} "
            f"tokens ({source}; {result['rows']} row{'s' * (result['rows'] != 1)} of segments of "
            f"{result['segment_length']} tokens, memory {result['memory_length']})"
        ]

    def describe(self, data: SegmentData) -> str:
        if data.context_segments:
            return (
                f"{super().describe(data)}; trained on random windows of {data.context_segments} context "
                f"segment(s) and one segment of {data.block_size} tokens, validated on {data.batch_size} rows "
                f"of consecutive segments"
            )
        return (
            f"{super().describe(data)}; read as {data.batch_size} rows of consecutive segments of "
            f"{data.block_size} tokens"
        )
