"""Forecasting: from the last ``input_length`` rows of a multivariate series, the next ``horizon``
rows of every column, under the standard protocol of the long-horizon forecasting literature
(data/series.py: chronological splits, standardisation with the training rows only, every window
with stride 1). Trained on the mean squared error of the standardised values and validated by it
(``valid_loss``) and the mean absolute error (``mae``), both averaged over every value of every
window of the split, as the papers report them. ``train.label_smoothing`` has no meaning here and
is not used.

The splits are ``splits.n_train``, ``n_valid`` and ``n_test`` consecutive rows from the first
(ETT hourly: 8,640, 2,880 and 2,880, twelve months and four and four), or else the last
``splits.test_fraction`` rows for test and the ``valid_fraction`` before them for validation (Autoformer's
split of its custom datasets). A split whose rows the file does not reach is not there: ETT's
development copy (``ETTh1_train_val.csv``, ``data get --dev-only``) stops where its test months
begin, and `attnlab evaluate RUN --data FULL.csv --split test` scores a run trained on it on the
full file's test rows, scaled as in training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch import Tensor, nn

from attnlab.config import at_least
from attnlab.data.series import (
    SPLITS,
    Scaler,
    Series,
    read_series,
    split_bounds,
    split_rows,
    window_starts,
)
from attnlab.errors import ConfigError, DataError
from attnlab.models.family import Inputs
from attnlab.models.shape import DataShape
from attnlab.tasks.batching import Batching, Tokenizers
from attnlab.tasks.parts import Splits
from attnlab.tasks.series_windows import EVAL_BATCH, SeriesBatch, SeriesData
from attnlab.tasks.task import Amp, Task, TaskConfig, register_task


@dataclass(frozen=True)
class ForecastingConfig(TaskConfig):
    """``path``: the CSV; ``date_column`` and the value ``columns`` (comma-separated; default every
    other column) in and out; windows of ``input_length`` rows followed by ``horizon`` rows to
    forecast; ``splits`` (tasks/parts.py): the splits' rows ``n_train``, ``n_valid``, ``n_test``
    (all three, or none for the fractions ``valid_fraction`` and ``test_fraction``)."""

    path: Optional[str] = None
    date_column: str = "date"
    columns: Optional[str] = None
    input_length: int = 336
    horizon: int = 96
    splits: Splits = Splits(valid_fraction=0.1, test_fraction=0.2)
    splits_read = ("n_train", "n_valid", "n_test", "valid_fraction", "test_fraction")

    def check(self) -> None:
        at_least("input_length", self.input_length, 1)
        at_least("horizon", self.horizon, 1)
        self.splits.read_by(self.chosen_name(), self.splits_read)
        given = [name for name in ("n_train", "n_valid", "n_test") if getattr(self.splits, name) is not None]
        if given and len(given) < 3:
            raise ConfigError(
                f"give all of splits.n_train, n_valid and n_test (rows), or none (then splits.valid_fraction "
                f"and test_fraction split the file); got only {', '.join(given)}"
            )
        self.splits.given("valid_fraction", "test_fraction")
        if self.columns is not None and not self.column_list:
            raise ConfigError("columns must name at least one column (comma-separated), or be left out for all")

    def check_trainable(self) -> None:
        if self.path is None:
            raise ConfigError("data.task 'forecasting' needs 'path' (a CSV with a date column and numeric columns)")

    @property
    def column_list(self) -> list[str] | None:
        return None if self.columns is None else [c.strip() for c in self.columns.split(",") if c.strip()]

    @property
    def rows(self) -> tuple[int, int, int] | None:
        held = self.splits
        if held.n_train is None or held.n_valid is None or held.n_test is None:
            return None
        return held.n_train, held.n_valid, held.n_test


def prepared(
    series: Series,
    scaler: Scaler | None,
    rows: tuple[int, int, int],
    cfg: ForecastingConfig,
    batching: Batching,
    required: Sequence[str],
) -> SeriesData:
    """``series`` standardised (by ``scaler``, or one fitted to its training rows) and windowed; the
    ``required`` splits must be in the file and hold a window each."""
    bounds = split_bounds(rows)
    if scaler is None:
        train_end = bounds["train"][1]
        if len(series) < train_end:
            raise DataError(
                f"{series.path}: {len(series):,} rows, fewer than the {train_end:,} training rows (data.splits.n_train)"
            )
        scaler = Scaler.fitted(series.values[:train_end])
    starts = {
        name: torch.tensor(window_starts(bounds[name], cfg.input_length, cfg.horizon))
        for name in SPLITS
        if bounds[name][1] <= len(series)
    }
    for name in required:
        if name in starts and not len(starts[name]):
            first, end = bounds[name]
            need = (
                f"input_length + horizon ({cfg.input_length} + {cfg.horizon} = {cfg.input_length + cfg.horizon})"
                if name == "train"
                else f"horizon ({cfg.horizon})"
            )
            raise DataError(
                f"{series.path}: split '{name}' (rows {first:,}-{end - 1:,}) is {end - first:,} rows, "
                f"too short for one window: it needs {need}"
            )
    data = SeriesData(
        series=series,
        values=torch.tensor(scaler(series.values), dtype=torch.float32),
        scaler=scaler,
        rows=rows,
        splits=starts,
        input_length=cfg.input_length,
        horizon=cfg.horizon,
        batch_size=batching.batch_size,
        seed=batching.seed,
    )
    for name in required:
        if name not in starts:
            raise DataError(data.missing(name))
    return data


def device_of(model: nn.Module) -> torch.device:
    """Where ``model`` runs: its parameters' device; the CPU for a model without any (last_value)."""
    return next(model.parameters(), torch.empty(0)).device


@torch.no_grad()
def errors_of(
    model: nn.Module, batches: typing.Iterable[SeriesBatch], amp: Amp = contextlib.nullcontext
) -> tuple[Tensor, Tensor, int]:
    """Sums over ``batches`` of the squared and the absolute errors, each (H, C) by lead time and
    channel (float64), and the number of windows."""
    model.eval()
    device = device_of(model)
    squared: Tensor | float
    absolute: Tensor | float
    squared = absolute = 0.0
    count = 0
    for batch in batches:
        with amp():
            errors = batch.to(device).errors(model).double()
        squared, absolute = squared + errors.square().sum(0).cpu(), absolute + errors.abs().sum(0).cpu()
        count += len(errors)
    return typing.cast(Tensor, squared), typing.cast(Tensor, absolute), count  # tensors: a split has windows


def forecast_report(
    model: nn.Module, data: SeriesData, split: str, amp: Amp = contextlib.nullcontext
) -> dict[str, Any]:
    """`attnlab evaluate`'s record (and validation's scores): MSE and MAE over every value of every
    window of ``split``, per channel and per lead time (1 ... H steps ahead) too."""
    squared, absolute, count = errors_of(model, data.eval_batches(split), amp)
    H, C = squared.shape
    first, end = data.bounds(split)
    return {
        "mse": float(squared.sum()) / (count * H * C),
        "mae": float(absolute.sum()) / (count * H * C),
        "windows": count,
        "split": split,
        "rows": [first, end],
        "file": data.series.path,
        "input_length": data.input_length,
        "horizon": H,
        "channels": data.series.columns,
        "mse_by_channel": (squared.sum(0) / (count * H)).tolist(),
        "mae_by_channel": (absolute.sum(0) / (count * H)).tolist(),
        "mse_by_step": (squared.sum(1) / (count * C)).tolist(),
    }


@register_task
class Forecasting(Task[SeriesData, SeriesBatch]):
    """The next values of a time series from a window of its past (data.task: forecasting); every
    forecast value is a target."""

    name = "forecasting"
    config = ForecastingConfig
    counts = "values"  # every forecast value of a window is a target
    needs = {"inputs": Inputs.SERIES}
    metrics = {"valid_loss": True, "mae": True}  # valid_loss: the MSE
    commands = ("forecast", "evaluate")
    file_splits = SPLITS  # a series file holds its train, valid and test rows (EvaluatesFileSplits)
    cfg: ForecastingConfig

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, Any] | None = None
    ) -> SeriesData:
        """Read and split the series; a new run fits the scaler to the training rows and needs the
        training and validation splits; a run's own ``state`` brings its columns, rows and scaler."""
        if state is not None:
            # data.path: given (ForecastingConfig.check)
            series = read_series(typing.cast(str, self.cfg.path), self.cfg.date_column, state["columns"])
            scaler = Scaler(state["mean"], state["std"])
            return prepared(series, scaler, tuple(state["rows"]), self.cfg, batching, ())
        # data.path: given (ForecastingConfig.check)
        series = read_series(typing.cast(str, self.cfg.path), self.cfg.date_column, self.cfg.column_list)
        held = self.cfg.splits
        rows = split_rows(len(series), self.cfg.rows, held.valid_fraction or 0.0, held.test_fraction or 0.0)
        return prepared(series, None, rows, self.cfg, batching, ("train", "valid"))

    def saved_state(self, data: SeriesData) -> dict[str, Any]:
        """The columns, the splits' row counts and the training rows' mean and standard deviation."""
        return {
            "columns": data.series.columns,
            "rows": list(data.rows),
            "mean": data.scaler.mean,
            "std": data.scaler.std,
        }

    def data_shape(self, data: SeriesData | None = None) -> DataShape:
        """Before the data is prepared: the columns named, or those of the file."""
        if data is not None:
            columns = data.series.columns
        else:
            # data.path: given (ForecastingConfig.check)
            columns = self.cfg.column_list or read_series(typing.cast(str, self.cfg.path), self.cfg.date_column).columns
        return DataShape(n_channels=len(columns), input_length=self.cfg.input_length, horizon=self.cfg.horizon)

    def loss(self, model: nn.Module, batch: SeriesBatch, label_smoothing: float, amp: Amp) -> tuple[Tensor, Tensor]:
        """The sum of squared errors (the trainer divides by the number of values: the MSE), twice."""
        with amp():
            squared = batch.errors(model).square().sum()
        return squared, squared.detach()

    def validate(
        self, model: nn.Module, data: SeriesData, device: torch.device, amp: Amp, n_decoded: int, split: str = "valid"
    ) -> dict[str, float]:
        report = forecast_report(model, data, split, amp)
        return {"valid_loss": report["mse"], "mae": report["mae"]}

    def evaluate_split(self, model: nn.Module, data: SeriesData, split: str) -> dict[str, Any]:
        return forecast_report(model, data, split)

    def evaluate_file(
        self, model: nn.Module, tokenizers: Tokenizers, state: dict[str, Any], path: str, split: str | None
    ) -> dict[str, Any]:
        """``split`` (default test) of the series in ``path``, read, split and scaled as the run's own."""
        split = split or self.file_splits[-1]
        data = self.evaluate_data(state, path)
        if split not in data.splits:
            raise DataError(data.missing(split))
        return forecast_report(model, data, split)

    def evaluate_data(self, state: dict[str, Any], path: str) -> SeriesData:
        """The series in ``path`` with the run's columns, split and scaled as the run's own data (its data
        section and ``state``); it may be shorter or longer than the run's file."""
        task = Forecasting(dataclasses.replace(self.cfg, path=path))
        return task.prepare(Batching(0, EVAL_BATCH, 0), state=state)

    def report(self, result: dict[str, Any], source: str) -> list[str]:
        """MSE and MAE over the split, and per channel (``source``: the record names its file and split)."""
        first, end = result["rows"]
        lines = [
            f"MSE  {result['mse']:.4f}   MAE  {result['mae']:.4f}   ({result['windows']:,} windows of split "
            f"'{result['split']}', rows {first:,}-{end - 1:,} of {result['file']}; input {result['input_length']}, "
            f"horizon {result['horizon']}; standardised values)"
        ]
        width = max(len(c) for c in result["channels"]) + 2
        lines.append(f"{'channel':<{width}}{'MSE':>9}{'MAE':>9}")
        lines += [
            f"{c:<{width}}{mse:>9.4f}{mae:>9.4f}"
            for c, mse, mae in zip(result["channels"], result["mse_by_channel"], result["mae_by_channel"])
        ]
        return lines

    def describe(self, data: SeriesData) -> str:
        bounds = split_bounds(data.rows)
        sizes = ", ".join(
            f"{name} {len(data.splits[name]):,} (rows {bounds[name][0]:,}-{bounds[name][1] - 1:,})"
            if name in data.splits
            else f"{name}: not in the file"
            for name in SPLITS
        )
        return (
            f"series {data.series.path}: {len(data.series):,} rows x {len(data.series.columns)} columns "
            f"({', '.join(data.series.columns)}), standardised with the training rows' mean and std; windows of "
            f"{data.input_length} + {data.horizon} rows, stride 1: {sizes}"
        )
