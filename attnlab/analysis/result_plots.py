"""Figures of what runs score and predict, written to PNG files as analysis/plots.py writes its attention
maps (Agg; each PNG's axis labels in its metadata, 'Description', JSON):

- ``confusion_plot``: a classifier's confusion matrix, the count in each cell;
- ``pruning_plot``: a metric against the fraction of heads pruned;
- ``lead_time_plot``: a forecaster's MSE against the steps ahead;
- ``forecast_plot``: history, forecast and truth of chosen channels of a series;
- ``sweep_plot``: a sweep's metrics against its first grid axis, one line per combination of the
  other axes, the bars one standard deviation over seeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from attnlab.analysis.plots import _annotate, _save  # noqa: E402


def confusion_plot(counts: list[list[int]], labels: Sequence[str], path: Path) -> Path:
    """A confusion matrix: true labels down, predicted across, the count in each cell."""
    grid = torch.tensor(counts, dtype=torch.float)
    n = len(labels)
    fig, ax = plt.subplots(figsize=(2.5 + 0.7 * n, 1.8 + 0.6 * n), layout="constrained")
    image = ax.imshow(grid.numpy(), cmap="Blues", aspect="auto", vmin=0)
    _annotate(ax, image, grid, "{:.0f}")
    ax.set_xticks(range(n), labels, rotation=90 if n > 6 else 0, fontsize=8)
    ax.set_yticks(range(n), labels, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    fig.colorbar(image, ax=ax, label="examples")
    ax.set_title("confusion matrix", fontsize=9)
    return _save(fig, path, {"title": "confusion matrix", "rows": list(labels), "cols": list(labels), "counts": counts})


def pruning_plot(fractions: Sequence[float], values: Sequence[float], metric: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([100 * f for f in fractions], values, marker="o")
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    ax.set_title(f"{metric} after pruning the least important heads", fontsize=9)
    fig.tight_layout()
    return _save(
        fig, path, {"x": "heads pruned (%)", "y": metric, "fractions": list(fractions), "values": list(values)}
    )


def lead_time_plot(mse_by_step: Sequence[float], title: str, path: Path) -> Path:
    """A forecaster's MSE against the lead time (1 ... H steps ahead), over every window and channel."""
    steps = list(range(1, len(mse_by_step) + 1))
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot(steps, mse_by_step)
    ax.set_xlabel("steps ahead")
    ax.set_ylabel("MSE (standardised)")
    ax.grid(True, alpha=0.3)
    ax.set_title(f"MSE by lead time: {title}", fontsize=9)
    fig.tight_layout()
    return _save(fig, path, {"x": "steps ahead", "y": "MSE (standardised)", "values": list(mse_by_step)})


def forecast_plot(forecast: Any, channels: Sequence[str], title: str, path: Path) -> Path:
    """One panel per channel: the input rows (history), the forecast and the truth where there is
    one, against the step from the forecast's origin (negative: history). ``forecast``: a
    cli/forecast.py Forecast."""
    L, H = len(forecast.history), len(forecast.values)
    fig, axes = plt.subplots(len(channels), 1, figsize=(8, 2.4 * len(channels)), squeeze=False, sharex=True)
    for ax, name in zip(axes[:, 0], channels):
        c = forecast.columns.index(name)
        ax.plot(range(-L, 0), forecast.history[:, c], color="0.45", lw=1, label="history")
        if len(forecast.truth):
            ax.plot(range(len(forecast.truth)), forecast.truth[:, c], color="black", lw=1, label="truth")
        ax.plot(range(H), forecast.values[:, c], color="tab:red", lw=1.5, label="forecast")
        ax.axvline(0, color="0.7", lw=0.8, ls="--")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(fontsize=8, loc="upper left")
    axes[0, 0].set_title(f"{title}: forecast from {forecast.dates[0]}", fontsize=9)
    axes[-1, 0].set_xlabel("steps from the forecast's origin")
    fig.tight_layout()
    return _save(
        fig,
        path,
        {
            "channels": list(channels),
            "origin": forecast.origin,
            "history": L,
            "horizon": H,
            "truth": len(forecast.truth),
        },
    )


def sweep_plot(table: Any, path: Path) -> Path:
    """One panel per metric of a sweep's ``table`` (analysis/sweep_table.py Table): the mean over seeds
    against the first axis's values (numbers on a numeric axis, logarithmic where they span 16x or
    more; anything else in the grid's order), one line per combination of the other axes."""
    first, others = table.axes[0], table.axes[1:]
    xs = list(dict.fromkeys(cell.value(first) for cell, _, _ in table.rows))  # a joint axis's values are tuples
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    position = {x: (x if numeric else i) for i, x in enumerate(xs)}
    fig, axes = plt.subplots(1, len(table.metrics), figsize=(4.5 * len(table.metrics), 3.5), squeeze=False)
    for ax, metric in zip(axes[0], table.metrics):
        lines: dict[str, list[tuple[Any, Any]]] = {}
        for cell, spreads, _ in table.rows:
            if metric in spreads:
                label = ", ".join(f"{a}={cell.shown(a)}" for a in others) or metric
                lines.setdefault(label, []).append((position[cell.value(first)], spreads[metric]))
        for label, points in lines.items():
            points.sort(key=lambda p: p[0])
            ax.errorbar(
                [p for p, _ in points],
                [s.mean for _, s in points],
                yerr=[s.std or 0.0 for _, s in points],
                marker="o",
                capsize=3,
                label=label,
            )
        if numeric and min(xs) > 0 and max(xs) >= 16 * min(xs):
            ax.set_xscale("log")
        if not numeric:
            shown = {cell.value(first): cell.shown(first) for cell, _, _ in table.rows}
            ax.set_xticks(range(len(xs)), [shown[x] for x in xs], rotation=30, fontsize=8)
        ax.set_xlabel(first)
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
        if others:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(
        fig,
        path,
        {"x": first, "x_values": [str(x) for x in xs], "metrics": list(table.metrics), "cells": len(table.rows)},
    )
