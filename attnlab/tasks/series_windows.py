"""A series as a forecaster's data: its windows (SeriesBatch: inputs (B, L, C) and targets (B, H, C),
standardised; WindowBatches: each batch cut from the series when asked for) and the prepared series
(SeriesData: the standardised values, the scaler, the splits' rows and their windows' first rows; an
epoch's order drawn from (seed, epoch) alone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from attnlab.data.series import Scaler, Series, split_bounds, windows
from attnlab.tasks.batching import batch_seed
from attnlab.tasks.classifier_task import ExampleBatch

EVAL_BATCH = 256  # windows per batch in evaluation


@dataclass
class SeriesBatch(ExampleBatch):
    """inputs: (B, L, C) and targets: (B, H, C), standardised; the loss sums over every target value."""

    inputs: Tensor
    targets: Tensor

    @property
    def n_targets(self) -> int:
        return self.targets.numel()

    def errors(self, model: Any) -> Tensor:  # a forecaster (model.forecast)
        """(B, H, C): forecast - truth."""
        return model.forecast(self.inputs).float() - self.targets


class WindowBatches(Sequence[SeriesBatch]):
    """The windows starting at ``starts``, ``size`` at a time, each batch cut from the series when asked for."""

    def __init__(self, values: Tensor, starts: Tensor, size: int, input_length: int, horizon: int) -> None:
        self.values, self.chunks, self.lengths = values, torch.split(starts, size), (input_length, horizon)

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, k: int) -> SeriesBatch:  # type: ignore[override]
        return SeriesBatch(*windows(self.values, self.chunks[k], *self.lengths))


@dataclass(kw_only=True)
class SeriesData:
    """The standardised series (N, C), the scaler, the splits' rows and, per split the file
    reaches, its windows' first rows; an epoch's order drawn from (seed, epoch) alone."""

    series: Series
    values: Tensor
    scaler: Scaler
    rows: tuple[int, int, int]
    splits: dict[str, Tensor]
    input_length: int
    horizon: int
    batch_size: int
    seed: int = 0

    def epoch_batches(self, epoch: int) -> WindowBatches:
        starts = self.splits["train"]
        order = torch.randperm(len(starts), generator=torch.Generator().manual_seed(batch_seed(self.seed, epoch, 0)))
        return WindowBatches(self.values, starts[order], self.batch_size, self.input_length, self.horizon)

    def eval_batches(self, split: str) -> WindowBatches:
        return WindowBatches(self.values, self.splits[split], EVAL_BATCH, self.input_length, self.horizon)

    def bounds(self, split: str) -> tuple[int, int]:
        return split_bounds(self.rows)[split]

    def missing(self, split: str) -> str:
        """Why the file has no ``split``: its rows end before the split's."""
        first, end = self.bounds(split)
        return (
            f"{self.series.path} has {len(self.series):,} rows; split '{split}' is rows {first:,}-{end - 1:,} "
            f"(a file that holds them, e.g. the full series: --data FILE)"
        )
