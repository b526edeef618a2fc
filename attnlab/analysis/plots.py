"""Figures, written to PNG files with matplotlib (Agg, no screen needed). Each PNG carries its
axis labels in its metadata ('Description', JSON) so that a program can check what it shows.

- ``attention_heatmaps``: one figure per attention module, one panel per head, tokens on the axes;
- ``alignment_plot``: source-target alignment in the style of Bahdanau et al. (2015), fig. 3;
- ``entropy_plot``: mean entropy per layer and head, the value written in each cell;
- ``pruning_plot``: a metric against the fraction of heads pruned;
- ``confusion_plot``: a classifier's confusion matrix, the count in each cell;
- ``patch_attention_plot``: attention over an image's patch grid, drawn on the image, one panel
  per map (layer and head, or the rollout);
- ``block_plot``: one block of an attention map (a single stream's words over its patches, or
  the reverse), or an average of them, as one heatmap;
- ``lead_time_plot``: a forecaster's MSE against the steps ahead;
- ``forecast_plot``: history, forecast and truth of chosen channels of a series;
- ``sweep_plot``: a sweep's metrics against its first grid axis, one line per combination of the
  other axes, the bars one standard deviation over seeds;
- ``positional_plots``: the sinusoidal table as a heatmap, and PE(p) . PE(p + k) against the
  offset k for several bases n.

Every heatmap has a colour bar. The first three draw their figure with ``attention_figure``,
``alignment_figure`` and ``entropy_figure``, which return it unsaved (for tests and notebooks).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.image import AxesImage  # noqa: E402
from torch import Tensor  # noqa: E402

from attnlab.nn.positional import sinusoid  # noqa: E402


def _save(fig, path: Path, labels: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Description": json.dumps(labels, ensure_ascii=False)})
    plt.close(fig)
    return path


MAX_TICKS = 32  # labels on an axis of a heatmap: every k-th beyond this (a ViT's 196 patches would overlap)
MAX_PANEL = 6.0  # inches: a heatmap of many positions stays this size, its labels thinned


def _ticks(labels: Sequence[str]) -> tuple[range, list[str]]:
    """Where an axis's labels go, and which: all of them, or every k-th where there are many."""
    every = math.ceil(len(labels) / MAX_TICKS)
    at = range(0, len(labels), every)
    return at, [labels[i] for i in at]


def _heatmap(ax, matrix: Tensor, rows: Sequence[str], cols: Sequence[str], title: str, vmax: float = 1.0) -> AxesImage:
    image = ax.imshow(matrix.float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
    ax.set_xticks(*_ticks(cols), rotation=90, fontsize=7)
    ax.set_yticks(*_ticks(rows), fontsize=7)
    ax.set_title(title, fontsize=9)
    return image


def attention_figure(probs: Tensor, rows: Sequence[str], cols: Sequence[str], title: str) -> Figure:
    """(H, Tq, Tk) weights of one module for one sentence -> a grid of H heatmaps on one 0-1 scale,
    with one colour bar for them all."""
    H = probs.shape[0]
    n_cols = min(H, 4)
    n_rows = math.ceil(H / n_cols)
    size = min(MAX_PANEL, max(2.5, 0.22 * max(len(rows), len(cols)) + 1.2))
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(size * n_cols + 0.8, size * n_rows), squeeze=False, layout="constrained"
    )
    for h, ax in enumerate(axes.flat):
        if h < H:
            image = _heatmap(ax, probs[h], rows, cols, f"head {h}")
        else:
            ax.axis("off")
    fig.colorbar(image, ax=axes, label="attention weight", shrink=0.8, pad=0.01)
    fig.suptitle(title, wrap=True)
    return fig


def attention_heatmaps(probs: Tensor, rows: Sequence[str], cols: Sequence[str], title: str, path: Path) -> Path:
    """:func:`attention_figure`, written to ``path``."""
    return _save(
        attention_figure(probs, rows, cols, title),
        path,
        {"title": title, "rows": list(rows), "cols": list(cols), "heads": probs.shape[0]},
    )


def first_token_plot(weights: Tensor, rows: Sequence[str], cols: Sequence[str], path: Path) -> Path:
    """(L * H, T) attention of the first token ([CLS], BERT's summary of the sequence) over the
    tokens, one row per layer and head, written to ``path``."""
    fig, ax = plt.subplots(
        figsize=(max(4.0, 0.3 * len(cols) + 2.0), max(2.5, 0.25 * len(rows) + 1.2)), layout="constrained"
    )
    title = f"attention of {cols[0]} per layer and head"
    fig.colorbar(_heatmap(ax, weights, rows, cols, title), ax=ax, label="attention weight", pad=0.01)
    return _save(fig, path, {"title": title, "rows": list(rows), "cols": list(cols)})


def alignment_figure(weights: Tensor, source: Sequence[str], target: Sequence[str], title: str) -> Figure:
    """(T, S) alignment, target words down, source words across, white = 1 (Bahdanau's figure),
    with a colour bar; the title is wrapped to the figure's width."""
    fig, ax = plt.subplots(
        figsize=(max(3.0, 0.35 * len(source) + 2.5), max(3.0, 0.35 * len(target) + 1.5)), layout="constrained"
    )
    image = ax.imshow(weights.float().cpu().numpy(), cmap="gray", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(source)), source, rotation=90)
    ax.set_yticks(range(len(target)), target)
    ax.xaxis.tick_top()
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    fig.colorbar(image, ax=ax, label="attention weight", shrink=0.6)
    fig.suptitle(title, fontsize=9, wrap=True)
    return fig


def alignment_plot(weights: Tensor, source: Sequence[str], target: Sequence[str], title: str, path: Path) -> Path:
    """:func:`alignment_figure`, written to ``path``."""
    return _save(
        alignment_figure(weights, source, target, title),
        path,
        {"title": title, "rows": list(target), "cols": list(source)},
    )


def _luma(rgb: Sequence[float]) -> float:
    """Perceived brightness of an RGB(A) colour in [0, 1] (ITU-R BT.601 weights)."""
    r, g, b = rgb[:3]
    return 0.299 * r + 0.587 * g + 0.114 * b


def _annotate(ax, image: AxesImage, grid: Tensor, style: str = "{:.2f}") -> None:
    """Write each cell's value (``style``: two decimals) on it, in black on light colours and white on dark."""
    for (i, j), value in np.ndenumerate(grid.numpy()):
        if not math.isnan(value):
            colour = "black" if _luma(image.cmap(image.norm(value))) > 0.5 else "white"
            ax.text(j, i, style.format(value), ha="center", va="center", fontsize=9, color=colour)


def entropy_figure(entropy: dict[str, Tensor], title: str = "mean attention entropy (nats)") -> Figure:
    """Modules down, heads across, the entropy in each cell, and a colour bar."""
    names = list(entropy)
    H = max(len(v) for v in entropy.values())
    grid = torch.full((len(names), H), float("nan"))
    for i, name in enumerate(names):
        grid[i, : len(entropy[name])] = entropy[name]
    fig, ax = plt.subplots(figsize=(3.0 + 0.9 * H, 1.2 + 0.5 * len(names)), layout="constrained")
    image = ax.imshow(grid.numpy(), cmap="magma", aspect="auto")
    _annotate(ax, image, grid)
    ax.set_xticks(range(H), [f"head {h}" for h in range(H)], fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    fig.colorbar(image, ax=ax, label="nats")
    ax.set_title(title, fontsize=9)
    return fig


def entropy_plot(entropy: dict[str, Tensor], path: Path, title: str = "mean attention entropy (nats)") -> Path:
    """:func:`entropy_figure`, written to ``path``."""
    H = max(len(v) for v in entropy.values())
    return _save(
        entropy_figure(entropy, title),
        path,
        {"title": title, "rows": list(entropy), "cols": [f"head {h}" for h in range(H)]},
    )


def patch_attention_figure(picture: np.ndarray, maps: Tensor, titles: Sequence[str], title: str) -> Figure:
    """``picture`` (H, W, C) in [0, 1]; ``maps`` (K, h, w) weights over the patch grid -> K panels,
    each the image in grey with the map drawn over it (patch by patch, on one 0-max scale)."""
    K = maps.shape[0]
    n_cols = min(K, 4)
    n_rows = math.ceil(K / n_cols)
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(2.4 * n_cols + 0.8, 2.4 * n_rows + 0.4), squeeze=False, layout="constrained"
    )
    H, W = picture.shape[:2]
    grey = picture.mean(-1)  # (H, W)
    vmax = float(maps.max())
    for k, ax in enumerate(axes.flat):
        ax.axis("off")
        if k < K:
            ax.imshow(grey, cmap="gray", vmin=0.0, vmax=1.0, extent=(0, W, H, 0))
            image = ax.imshow(
                maps[k].float().cpu().numpy(),
                cmap="inferno",
                alpha=0.6,
                vmin=0.0,
                vmax=vmax,
                extent=(0, W, H, 0),
                interpolation="nearest",
            )
            ax.set_title(titles[k], fontsize=8)
    fig.colorbar(image, ax=axes, label="attention weight", shrink=0.8, pad=0.01)
    fig.suptitle(title, wrap=True, fontsize=9)
    return fig


def patch_attention_plot(picture: np.ndarray, maps: Tensor, titles: Sequence[str], title: str, path: Path) -> Path:
    """:func:`patch_attention_figure`, written to ``path``."""
    return _save(
        patch_attention_figure(picture, maps, titles, title),
        path,
        {"title": title, "panels": list(titles), "grid": list(maps.shape[1:])},
    )


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


def forecast_plot(forecast, channels: Sequence[str], title: str, path: Path) -> Path:
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


def sweep_plot(table, path: Path) -> Path:
    """One panel per metric of a sweep's ``table`` (analysis/sweep_table.py Table): the mean over seeds
    against the first axis's values (numbers on a numeric axis, logarithmic where they span 16x or
    more; anything else in the grid's order), one line per combination of the other axes."""
    first, others = table.axes[0], table.axes[1:]
    xs = list(dict.fromkeys(cell.value(first) for cell, _, _ in table.rows))  # a joint axis's values are tuples
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    position = {x: (x if numeric else i) for i, x in enumerate(xs)}
    fig, axes = plt.subplots(1, len(table.metrics), figsize=(4.5 * len(table.metrics), 3.5), squeeze=False)
    for ax, metric in zip(axes[0], table.metrics):
        lines: dict[str, list] = {}
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


def positional_plots(
    out_dir: Path,
    dim: int = 64,
    positions: int = 100,
    bases: Sequence[float] = (100.0, 1000.0, 10000.0),
    max_offset: int = 100,
) -> list[Path]:
    """The sinusoidal table (positions x dimensions), and the normalised dot product between
    positions p and p + k against k, for each base n: it falls with distance and oscillates, the
    faster the smaller n (each pair of dimensions is a rotation by k * theta_i)."""
    table = sinusoid(torch.arange(positions), dim)  # (positions, dim)
    fig, ax = plt.subplots(figsize=(6, 4))
    image = ax.imshow(table.numpy(), cmap="RdBu", aspect="auto")
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    ax.set_title(f"sinusoidal positional encoding, d = {dim}, n = 10000", fontsize=9)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    heatmap = _save(fig, out_dir / "positional_table.png", {"x": "dimension", "y": "position"})
    fig, ax = plt.subplots(figsize=(6, 4))
    offsets = torch.arange(max_offset + 1)
    for base in bases:
        pe = sinusoid(offsets, dim, base)
        ax.plot(offsets.numpy(), (pe @ pe[0] / pe[0].dot(pe[0])).numpy(), label=f"n = {base:g}")
    ax.set_xlabel("offset k")
    ax.set_ylabel("PE(p) . PE(p + k) / |PE(p)|^2")
    ax.legend()
    ax.grid(True, alpha=0.3)
    ax.set_title(f"similarity against offset, d = {dim}", fontsize=9)
    fig.tight_layout()
    curve = _save(
        fig, out_dir / "positional_similarity.png", {"x": "offset k", "y": "similarity", "bases": list(bases)}
    )
    return [heatmap, curve]


def block_plot(weights: Tensor, rows: Sequence[str], cols: Sequence[str], title: str, path: Path) -> Path:
    """(R, C) attention weights (a block of a map, or one averaged) as one heatmap with a colour bar,
    on a 0-max scale, written to ``path``."""
    fig, ax = plt.subplots(
        figsize=(max(4.0, 0.3 * len(cols) + 2.0), max(2.5, 0.25 * len(rows) + 1.2)), layout="constrained"
    )
    image = _heatmap(ax, weights, rows, cols, title, vmax=max(float(weights.max()), 1e-6))
    fig.colorbar(image, ax=ax, label="attention weight", pad=0.01)
    return _save(fig, path, {"title": title, "rows": list(rows), "cols": list(cols)})
