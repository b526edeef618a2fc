"""Multivariate time series: a CSV file with a date column and numeric columns, one row per time
step (the ETT files' layout: ``date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT``), split by time into
training, validation and test rows, standardised with the training rows' statistics, and cut into
windows of ``input_length`` steps followed by ``horizon`` steps to forecast.

The protocol of the Informer / Autoformer / PatchTST code (their data loaders; the README.md that
`attnlab data get ett` writes gives the split sizes): the splits are consecutive blocks of rows; a window belongs to the split that holds its forecast
targets, and its input may reach back into the rows before the split; every window, stride 1. A
split of R rows thus has R - H + 1 windows, the first split (no rows before it) R - L - H + 1.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnlab.data.corpora import read_text
from attnlab.errors import DataError

SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class Series:
    """A CSV's rows: each row's date (as written), the numeric columns' names and values (N, C)."""

    path: str
    dates: list[str]
    columns: list[str]
    values: np.ndarray  # (N, C) float64

    def __len__(self) -> int:
        return len(self.dates)


def read_series(path: str | Path, date_column: str = "date", columns: list[str] | None = None) -> Series:
    """The CSV at ``path``: its ``date_column`` and ``columns`` (default: every other column), each
    cell a finite number. Errors name the file, and the line and column of a bad cell."""
    name = str(path)
    reader = csv.reader(io.StringIO(read_text(path), newline=""))
    header = [cell.strip() for cell in next(reader, [])]
    if not any(header):
        raise DataError(f"{name}: empty file (expected a header line, e.g. {date_column},value)")
    if date_column not in header:
        raise DataError(
            f"{name}:1: no date column '{date_column}' in the header ({', '.join(header)}); name it with "
            f"data.date_column"
        )
    wanted = columns if columns is not None else [c for c in header if c != date_column]
    missing = [c for c in wanted if c not in header]
    if missing:
        raise DataError(f"{name}:1: no column '{missing[0]}' in the header ({', '.join(header)})")
    if not wanted:
        raise DataError(f"{name}:1: no value columns beside '{date_column}'")
    date_at, value_at = header.index(date_column), [header.index(c) for c in wanted]
    dates, values = [], []
    for row in reader:
        if not row:  # a blank line
            continue
        n = reader.line_num
        if len(row) != len(header):
            raise DataError(f"{name}:{n}: {len(row)} fields, but the header has {len(header)}")
        dates.append(row[date_at])
        values.append([_number(row[at], f"{name}:{n}:{at + 1}", header[at]) for at in value_at])
    if not dates:
        raise DataError(f"{name}: a header and no rows")
    return Series(name, dates, wanted, np.array(values))


def _number(cell: str, where: str, column: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        shown = repr(cell) if cell.strip() else "an empty cell"
        raise DataError(f"{where}: {shown} in column '{column}' is not a number") from None
    if not math.isfinite(value):
        raise DataError(f"{where}: {cell!r} in column '{column}' is not a finite number")
    return value


def split_rows(
    n_rows: int, rows: tuple[int, int, int] | None, valid_fraction: float, test_fraction: float
) -> tuple[int, int, int]:
    """(train, valid, test) row counts: as given, or else fractions of ``n_rows`` as Autoformer's
    custom datasets have them (test and valid rounded down, train the rest)."""
    if rows is not None:
        return rows
    test, valid = int(n_rows * test_fraction), int(n_rows * valid_fraction)
    return n_rows - valid - test, valid, test


def split_bounds(rows: tuple[int, int, int]) -> dict[str, tuple[int, int]]:
    """Each split's rows [first, end): consecutive blocks from row 0."""
    ends = np.cumsum(rows).tolist()
    return {name: (end - size, end) for name, size, end in zip(SPLITS, rows, ends)}


@dataclass(frozen=True)
class Scaler:
    """x -> (x - mean) / std per column, with the training rows' mean and (population) standard
    deviation, as scikit-learn's StandardScaler in the reference code; a constant column keeps std 1."""

    mean: list[float]
    std: list[float]

    @classmethod
    def fitted(cls, values: np.ndarray) -> "Scaler":
        """From (N, C) training rows."""
        std = values.std(axis=0)
        return cls(values.mean(axis=0).tolist(), np.where(std > 0, std, 1.0).tolist())

    def __call__(self, values: np.ndarray) -> np.ndarray:
        scaled: np.ndarray = (values - np.array(self.mean)) / np.array(self.std)
        return scaled

    def inverse(self, scaled: Tensor) -> Tensor:
        """(..., C) standardised -> the file's units."""
        return scaled * torch.tensor(self.std, dtype=scaled.dtype) + torch.tensor(self.mean, dtype=scaled.dtype)


def window_starts(bounds: tuple[int, int], input_length: int, horizon: int) -> range:
    """The first input row of every window whose ``horizon`` targets lie in the rows ``bounds``
    [first, end) and whose ``input_length`` inputs lie in the file (they may precede ``first``)."""
    first, end = bounds
    return range(max(first - input_length, 0), end - input_length - horizon + 1)


def windows(values: Tensor, starts: Tensor, input_length: int, horizon: int) -> tuple[Tensor, Tensor]:
    """(inputs (B, L, C), targets (B, H, C)) of the windows starting at ``starts`` (B,) in ``values`` (N, C)."""
    steps = torch.arange(input_length + horizon)  # (L + H,)
    rows = values[starts[:, None] + steps]  # (B, L + H, C)
    return rows[:, :input_length], rows[:, input_length:]


def future_dates(dates: list[str], count: int) -> list[str]:
    """``count`` dates after the last of ``dates``, a step apart as its last two are; when they are
    not ISO dates, 't+1', 't+2', ..."""
    try:
        last, before = datetime.fromisoformat(dates[-1]), datetime.fromisoformat(dates[-2])
    except (ValueError, IndexError):
        return [f"t+{k}" for k in range(1, count + 1)]
    step, form = last - before, "%Y-%m-%d %H:%M:%S" if " " in dates[-1] else "%Y-%m-%d"
    return [(last + step * k).strftime(form) for k in range(1, count + 1)]
