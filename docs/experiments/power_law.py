"""A power law L = a X^-alpha fitted to a sweep's validation losses (docs/claims/scaling_law.md, "A scaling
law on the character LM"): X is the runs' parameter count or their training tokens, whichever
differs between the cells; each cell's mean over its seeds is one point, and the fit is least
squares on log L against log X.

    python docs/experiments/power_law.py runs/scaling-params [UP_TO]   (fit the points with X <= UP_TO only)
    python docs/experiments/power_law.py runs/scaling-tokens
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np


def cells(sweep: Path) -> dict[str, list[dict]]:
    """Each cell's finished runs' summaries, by the cell's directory name."""
    found: dict[str, list[dict]] = defaultdict(list)
    for summary in sorted(sweep.glob("*/seed*/summary.json")):
        found[summary.parent.parent.name].append(json.loads(summary.read_text()))
    return found


def main(sweep: Path, up_to: float = float("inf")) -> None:
    points = []
    for name, runs in cells(sweep).items():
        losses = [r["best_valid_loss"] for r in runs]
        points.append(
            (
                runs[0]["n_params"],
                runs[0]["train_tokens"],
                statistics.mean(losses),
                statistics.stdev(losses) if len(losses) > 1 else 0.0,
                len(runs),
                name,
            )
        )
    axis, column = ("parameters", 0) if len({p[0] for p in points}) > 1 else ("training tokens", 1)
    points.sort(key=lambda p: p[column])
    print("| cell | parameters | training tokens | validation loss (mean ± sd) | seeds |\n|---|---|---|---|---|")
    for params, tokens, mean, sd, n, name in points:
        print(f"| {name} | {params:,} | {tokens:,} | {mean:.4f} ± {sd:.4f} | {n} |")
    fitted = [p for p in points if p[column] <= up_to]
    x = np.log([p[column] for p in fitted])
    y = np.log([p[2] for p in fitted])
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    print(
        f"\nL = {np.exp(intercept):.4g} x ({axis})^-{-slope:.4f} over {len(fitted)} points; largest |log residual| "
        f"{abs(residual).max():.4f}"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else float("inf"))
