"""Batches: padding (to a multiple of 8, for few shapes), teacher-forcing shifts, token-budget
length bucketing, LM blocks, and a stream's consecutive segments (Transformer-XL's layout).

For a target y = y_1 ... y_n the decoder reads ``tgt_in`` = BOS y_1 ... y_n and is trained to
predict ``tgt_out`` = y_1 ... y_n EOS (teacher forcing). Sources end with EOS, as in fairseq.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.data.tokenizers import BOS, EOS, PAD

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from attnlab.nn.memory import SegmentMemory


@dataclass
class Batch:
    """src: (B, S) or None for a language model; tgt_in, tgt_out: (B, T). PAD marks padding."""

    src: Tensor | None
    tgt_in: Tensor
    tgt_out: Tensor

    @property
    def n_targets(self) -> int:
        """Target tokens that count in the loss (not padding)."""
        return int((self.tgt_out != PAD).sum())

    def to(self, device: torch.device | str) -> "Batch":
        return moved(self, device)


def pad_sequences(seqs: list[list[int]]) -> Tensor:
    """Right-pad with PAD to the longest: (B, max_len) int64."""
    out = torch.full((len(seqs), max(map(len, seqs))), PAD, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def source_batch(sources: list[list[int]]) -> Tensor:
    """Source ids -> (B, S) padded, each source followed by EOS (training and decoding alike)."""
    return pad_sequences([s + [EOS] for s in sources])


def collate_pairs(pairs: list[tuple[list[int], list[int]]]) -> Batch:
    """Token-id pairs -> a padded seq2seq batch with source + EOS, BOS + target and target + EOS."""
    return Batch(
        src=source_batch([s for s, _ in pairs]),
        tgt_in=pad_sequences([[BOS] + t for _, t in pairs]),
        tgt_out=pad_sequences([t + [EOS] for _, t in pairs]),
    )


B = TypeVar("B")  # a batch: a dataclass of tensors


def tensor_fields(batch: DataclassInstance) -> dict[str, Tensor]:
    """The tensors of a batch (a dataclass), by field name."""
    return {f.name: t for f in dataclasses.fields(batch) if isinstance(t := getattr(batch, f.name), Tensor)}


def moved(batch: B, device: torch.device | str) -> B:
    """``batch`` (a dataclass) with each of its tensors on ``device``, its other fields as they are:
    every batch class's ``to``. From the CPU to a GPU the copy goes through pinned memory and does
    not wait: the host queues it behind the step the GPU is still running and goes on (the step
    never waits for the device either, train/step.py), so the next batch is there when its step
    starts."""
    device = torch.device(device)
    # B is a dataclass; its TypeVar cannot be bound to DataclassInstance (tasks/batching.py passes its Batch protocol)
    data = cast("DataclassInstance", batch)
    return cast(B, dataclasses.replace(data, **{name: copied(t, device) for name, t in tensor_fields(data).items()}))


def copied(t: Tensor, device: torch.device) -> Tensor:
    """``t`` on ``device``; CPU to CUDA through pinned memory, without waiting."""
    if t.device.type == "cpu" and device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def padded_to_multiple(batch: B, multiple: int) -> B:
    """``batch`` with each of its (B, T) tensors right-padded with PAD to T a multiple of ``multiple``.
    Padding is masked everywhere (keys, losses, pooling), so the numbers are the same; what changes
    is how many shapes there are: with token-budget batches nearly every batch had a length of its
    own, and each new shape costs a compiled graph (train.compile) or a kernel plan (cuDNN attention)
    on a GPU, where lengths a multiple of 8 also suit the tensor cores."""
    if multiple == 1:
        return batch
    data = cast("DataclassInstance", batch)  # a dataclass, as in moved
    return cast(
        B,
        dataclasses.replace(
            data,
            **{
                name: F.pad(t, (0, -t.shape[1] % multiple), value=PAD)
                for name, t in tensor_fields(data).items()
                if t.dim() == 2
            },
        ),
    )


def token_budget_batches(lengths: list[int], max_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Group example indices into batches of similar length with at most ``max_tokens`` padded tokens
    (batch size x longest example), as fairseq's ``--max-tokens``; an example longer than the budget
    gets a batch of its own. Ties in length are broken and batches ordered at random, reproducibly
    from (seed, epoch)."""
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    order.sort(key=lambda i: lengths[i])  # stable: shuffled within each length
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > max_tokens:  # sorted: lengths[i] is the longest
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def sampled_batch(n_examples: int, batch_size: int, seed: int) -> list[int]:
    """``batch_size`` example indices drawn uniformly with replacement, reproducibly from ``seed``
    (Lake & Baroni 2018 sampled SCAN's commands so, one a step)."""
    rng = random.Random(seed)
    return [rng.randrange(n_examples) for _ in range(batch_size)]


def lm_blocks(data: Tensor, block_size: int, batch_size: int, generator: torch.Generator) -> Batch:
    """nanoGPT-style training batch: ``batch_size`` random windows of a (N,) token stream;
    tgt_out is tgt_in shifted by one."""
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    windows = torch.stack([data[s : s + block_size + 1] for s in starts.tolist()])  # (B, block + 1)
    return Batch(None, windows[:, :-1], windows[:, 1:])


def lm_eval_blocks(data: Tensor, block_size: int, batch_size: int) -> list[Batch]:
    """Every full, non-overlapping window of a (N,) stream, in order: a deterministic evaluation set."""
    n = (len(data) - 1) // block_size
    windows = torch.stack([data[i * block_size : i * block_size + block_size + 1] for i in range(n)])
    return [Batch(None, w[:, :-1], w[:, 1:]) for w in torch.split(windows, batch_size)]


class SegmentRows:
    """Rows of a stream read segment by segment (:func:`lm_segments`), and what a model carries from
    one segment of them to the next (Transformer-XL's memory): ``keep(k, value)`` after segment k,
    ``carried(k)`` before it, which is None unless segment k - 1 was the last one read (the first
    segment, a resumed run, another pass over the batches)."""

    index: int
    value: SegmentMemory | None

    def __init__(self) -> None:
        self.index, self.value = -1, None

    def carried(self, k: int) -> SegmentMemory | None:
        return self.value if self.index == k - 1 else None

    def keep(self, k: int, value: SegmentMemory) -> None:
        self.index, self.value = k, value


@dataclass
class SegmentBatch(Batch):
    """Segment ``index`` of every row of ``rows``: tgt_in, tgt_out (B, T)."""

    rows: SegmentRows
    index: int


@dataclass
class ContextSegmentBatch(Batch):
    """Transformer-XL trained on random windows: tgt_in, tgt_out (B, T), one segment of each window,
    and ``context`` (B, k T), the k segments before it, which the model reads first (with no
    gradient) for the memory that reading the text in order would leave the segment."""

    context: Tensor


def lm_context_windows(
    data: Tensor, segment_length: int, batch_size: int, generator: torch.Generator, context_segments: int
) -> ContextSegmentBatch:
    """``batch_size`` random windows of a (N,) stream, each ``context_segments`` segments of context
    and then the segment to train on (tgt_out is tgt_in shifted by one)."""
    context = context_segments * segment_length
    windows = lm_blocks(data, context + segment_length, batch_size, generator)
    return ContextSegmentBatch(
        None, windows.tgt_in[:, context:], windows.tgt_out[:, context:], windows.tgt_in[:, :context]
    )


def lm_segments(data: Tensor, segment_length: int, rows: int) -> list[SegmentBatch]:
    """Transformer-XL's layout of a (N,) stream: cut into ``rows`` contiguous rows of equal length
    (fewer when it has fewer whole segments), each read in consecutive segments of ``segment_length``
    tokens (the last one of a row may be shorter). Batch k holds segment k of every row, so row i of
    batch k + 1 continues row i of batch k; all share one :class:`SegmentRows`. The last (N - 1) %
    rows tokens are left out; tgt_out is tgt_in shifted by one."""
    rows = max(1, min(rows, (len(data) - 1) // segment_length))
    length = (len(data) - 1) // rows  # (rows, length) inputs, each row's targets one further on
    inputs, targets = data[: rows * length].view(rows, length), data[1 : rows * length + 1].view(rows, length)
    carrier = SegmentRows()
    return [
        SegmentBatch(
            None,
            inputs[:, s : s + segment_length].contiguous(),
            targets[:, s : s + segment_length].contiguous(),
            carrier,
            k,
        )
        for k, s in enumerate(range(0, length, segment_length))
    ]
