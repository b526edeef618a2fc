"""`attnlab forecast`'s logic (the command itself is cli/evaluate.py's cmd_forecast): ``--origin``
read as a row number or a date of the series (:func:`origin_row`), and a forecasting run's
forecast from that row (:func:`forecast_from`), in the file's units, with the truth the file has
(:class:`Forecast`, which analysis/result_plots.py's forecast_plot draws)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from torch import nn

from attnlab.data.series import Series, future_dates
from attnlab.errors import UsageError
from attnlab.tasks.forecasting import device_of
from attnlab.tasks.series_windows import SeriesData

if TYPE_CHECKING:
    from attnlab.nn.series import DLinear, LastValue, PatchTST


@dataclass(frozen=True)
class Forecast:
    """One forecast, in the file's units: from row ``origin`` on, ``horizon`` rows (``dates``,
    ``values`` (H, C)) after the ``history`` (L, C) of the rows before; ``truth`` (k, C), the rows
    the file has from ``origin`` on (k <= H), and, when it has all H, the window's scaled MSE and MAE."""

    origin: int
    columns: list[str]
    dates: list[str]
    history: np.ndarray
    values: np.ndarray
    truth: np.ndarray
    scores: dict[str, float] | None


@torch.no_grad()
def forecast_from(model: nn.Module, data: SeriesData, origin: int) -> Forecast:
    """The forecast of the rows from ``origin`` (0-based, <= the number of rows) on, from the
    ``input_length`` rows before it."""
    L, H, n = data.input_length, data.horizon, len(data.series)
    if not L <= origin <= n:
        raise UsageError(
            f"--origin must leave input_length ({L}) rows before it in {data.series.path} and lie within "
            f"its {n:,} rows: between {L} and {n} (got {origin})"
        )
    model.eval()
    forecaster = cast("PatchTST | DLinear | LastValue", model)  # the forecasting families' models
    scaled = forecaster.forecast(data.values[None, origin - L : origin].to(device_of(model))).float().cpu()[0]  # (H, C)
    truth = data.values[origin : origin + H]  # (k, C)
    scores = None
    if len(truth) == H:
        scores = {"mse": float((scaled - truth).square().mean()), "mae": float((scaled - truth).abs().mean())}
    dates = data.series.dates[origin : origin + H]
    dates += future_dates(data.series.dates, H - len(dates))
    unscaled = data.scaler.inverse
    return Forecast(
        origin,
        data.series.columns,
        dates,
        unscaled(data.values[origin - L : origin]).numpy(),
        unscaled(scaled).numpy(),
        unscaled(truth).numpy(),
        scores,
    )


def _when(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        return None


def origin_row(origin: str | None, series: Series) -> int:
    """`forecast --origin`: a row number, or a date of the series' date column as written there or
    in any ISO form that names the same moment as exactly one row ('2017-10-20' is the row of
    '2017-10-20 00:00:00'); None: after the last row. A date between rows is refused with the
    nearest rows."""
    if origin is None:
        return len(series)
    if origin.strip().isdigit():
        return int(origin)
    if origin in series.dates:
        return series.dates.index(origin)
    when, times = _when(origin), [_when(d) for d in series.dates]
    if when is not None and None not in times:
        try:
            gaps = [abs(cast(datetime, t) - when) for t in times]  # None is not in times
        except TypeError:  # one has a time zone and the other not: they cannot be compared
            gaps = None
        if gaps is not None:
            rows = [i for i, gap in enumerate(gaps) if not gap]
            if len(rows) == 1:
                return rows[0]
            if rows:
                raise UsageError(
                    f"--origin {origin!r} is the date of {len(rows)} rows of {series.path} "
                    f"({', '.join(map(str, rows[:5]))}); give a row number"
                )
            nearest = sorted(sorted(range(len(gaps)), key=gaps.__getitem__)[:3])
            raise UsageError(
                f"--origin {origin!r} is no date of {series.path}; the nearest rows are "
                + ", ".join(f"{i} ({series.dates[i]})" for i in nearest)
                + " (give a row number or one of its dates)"
            )
    raise UsageError(
        f"--origin {origin!r} is neither a row number nor a date of {series.path} (its dates run from "
        f"{series.dates[0]!r} to {series.dates[-1]!r})"
    )
