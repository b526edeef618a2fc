"""Gradient norms over the first steps of each run of a sweep (docs/claims/norm_warmup.md, post-norm, pre-norm and
warm-up).

Reads every run OUT/CELL/seedK of ``attnlab sweep recipes/claims/norm_warmup_sweep.yaml --out OUT``:
its metrics.jsonl (the gradient norm before clipping, logged every ``log_every`` steps) and its
summary.json (the validation loss at the end). Per cell, averaged over seeds (the lowest and highest
seed in brackets for the largest norm): the gradient norm at the first logged step, the largest one
up to step 200, the one at the last logged step, and the final validation loss. Prints Markdown.

    .venv/bin/python docs/experiments/gradient_norms.py runs/norm-warmup
"""

import json
import statistics
import sys
from pathlib import Path


def norms(run: Path, last_step: int = 200) -> dict[int, float]:
    """Step -> gradient norm of the training log lines up to ``last_step``."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["grad_norm"] for r in lines if r.get("split") == "train" and r["step"] <= last_step}


def main(out: Path) -> None:
    print("| cell | first logged | largest to step 200 (min-max over seeds) | last logged | valid loss | seeds |")
    print("|---|---|---|---|---|---|")
    for cell in sorted(p for p in out.iterdir() if p.is_dir() and any(p.glob("seed*/summary.json"))):
        runs = [p.parent for p in sorted(cell.glob("seed*/summary.json"))]
        logged = [norms(run) for run in runs]
        first = statistics.fmean(n[min(n)] for n in logged)
        largest = [max(n.values()) for n in logged]
        last = statistics.fmean(n[max(n)] for n in logged)
        loss = statistics.fmean(
            json.loads((run / "summary.json").read_text())["last_eval"]["valid_loss"] for run in runs
        )
        print(
            f"| {cell.name} | {first:.3g} | {statistics.fmean(largest):.3g} ({min(largest):.3g}-{max(largest):.3g}) "
            f"| {last:.3g} | {loss:.3f} | {len(runs)} |"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
