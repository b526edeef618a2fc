"""Figures of attention (and of the positional table), written to PNG files with matplotlib (Agg, no
screen needed). Each PNG carries its axis labels in its metadata ('Description', JSON) so that a
program can check what it shows. The figures of what runs score and predict (confusion matrices,
pruning curves, forecasts, sweeps) are analysis/result_plots.py's.

- ``attention_heatmaps``: one figure per attention module, one panel per head, tokens on the axes;
- ``alignment_plot``: source-target alignment in the style of Bahdanau et al. (2015), fig. 3;
- ``entropy_plot``: mean entropy per layer and head, the value written in each cell;
- ``patch_attention_plot``: attention over an image's patch grid, drawn on the image, one panel
  per map (layer and head, or the rollout);
- ``block_plot``: one block of an attention map (a single stream's words over its patches, or
  the reverse), or an average of them, as one heatmap;
- ``positional_plots``: the sinusoidal table as a heatmap, and PE(p) . PE(p + k) against the
  offset k for several bases n.

Every heatmap has a colour bar. The first three draw their figure with ``attention_figure``,
``alignment_figure`` and ``entropy_figure``, which return it unsaved (for tests and notebooks).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.image import AxesImage  # noqa: E402
from torch import Tensor  # noqa: E402

from attnlab.nn.positional import sinusoid  # noqa: E402


def _save(fig: Figure, path: Path, labels: dict[str, Any]) -> Path:
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


def _heatmap(
    ax: Axes, matrix: Tensor, rows: Sequence[str], cols: Sequence[str], title: str, vmax: float = 1.0
) -> AxesImage:
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


def spectrogram_plot(features: Tensor, hop_seconds: float, title: str, path: Path) -> Path:
    """(F, n_mels) log-mel frames, one every ``hop_seconds``: bands up, time across, written to ``path``."""
    fig, ax = plt.subplots(figsize=(max(4.0, 0.02 * len(features) + 2.0), 3.0), layout="constrained")
    extent = (0.0, len(features) * hop_seconds, 0.0, float(features.shape[1]))
    image = ax.imshow(features.T.float().cpu().numpy(), origin="lower", aspect="auto", cmap="magma", extent=extent)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("mel band")
    fig.colorbar(image, ax=ax, label="log-mel", pad=0.01)
    fig.suptitle(title, fontsize=9, wrap=True)
    return _save(fig, path, {"title": title, "frames": len(features), "bands": features.shape[1]})


def _luma(rgb: Sequence[float] | np.ndarray) -> float:
    """Perceived brightness of an RGB(A) colour in [0, 1] (ITU-R BT.601 weights)."""
    r, g, b = rgb[:3]
    return 0.299 * r + 0.587 * g + 0.114 * b


def _annotate(ax: Axes, image: AxesImage, grid: Tensor, style: str = "{:.2f}") -> None:
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
