"""Exact match by sequence length for the runs of a length-generalisation sweep (docs/claims/positions.md).

For every run OUT/CELL/seedK of ``attnlab sweep recipes/extrapolation/sweep.yaml --out OUT``, the
best checkpoint decodes (greedy) its validation split (the training lengths) and its test split
(longer sequences); the exact match is counted per band of source lengths and averaged over the
seeds of each cell (mean, and the lowest and highest seed in brackets). Prints a Markdown table.

    .venv/bin/python docs/experiments/extrapolation_curve.py runs/extrapolation
"""

import statistics
import sys
from pathlib import Path

from attnlab.runs.checkpoint import load_run
from attnlab.runs.data import read_run_data
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.translation import decode_split

BANDS = ((1, 20), (21, 25), (26, 30), (31, 40), (41, 60), (61, 80))


def band_scores(run: Path) -> dict[tuple[int, int], float]:
    """Exact match of greedy decoding per band of source lengths, over the valid and test splits."""
    model, _, _ = load_run(run)
    data = read_run_data(RunDir(run))
    hits: dict[tuple[int, int], list[bool]] = {band: [] for band in BANDS}
    for split in ("valid", "test"):
        for src, ref, hyp in decode_split(model, data, split):
            n = len(src.split(" + ")[0].split())  # symbols; digits of a number for addition
            for low, high in BANDS:
                if low <= n <= high:
                    hits[(low, high)].append(hyp == ref)
    return {band: sum(h) / len(h) for band, h in hits.items() if h}


def main(out: Path) -> None:
    cells = sorted(p for p in out.iterdir() if p.is_dir() and any(p.glob("seed*/summary.json")))
    head = ["cell", *(f"{a}-{b}" for a, b in BANDS), "seeds"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for cell in cells:
        runs = [p.parent for p in sorted(cell.glob("seed*/summary.json"))]
        scores = [band_scores(run) for run in runs]
        row = []
        for band in BANDS:
            values = [100 * s[band] for s in scores if band in s]
            row.append(f"{statistics.fmean(values):.1f} ({min(values):.1f}-{max(values):.1f})" if values else "-")
        print(f"| {cell.name} | " + " | ".join(row) + f" | {len(runs)} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
