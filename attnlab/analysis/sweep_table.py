"""A sweep's results table (analysis/sweep.py plans and launches the runs): per cell, the mean,
standard deviation, minimum and maximum over seeds of each metric, read from the finished runs'
scores (PlannedRun.scores: their summary.json and evaluation); written as results.md, results.csv,
every run's scores in runs.csv, and results.png (analysis/result_plots.py's sweep_plot)."""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.analysis.sweep_spec import Cell, Evaluation, PlannedRun, SweepSpec
from attnlab.files import atomic_write_text


@dataclass(frozen=True)
class Spread:
    """A metric over a cell's seeds."""

    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        """The sample standard deviation (n - 1); None for one run."""
        return statistics.stdev(self.values) if len(self.values) > 1 else None

    def __str__(self) -> str:
        return f"{self.mean:.4g}" + (f" ± {self.std:.2g}" if self.std is not None else "")


@dataclass(frozen=True)
class Table:
    axes: list[str]
    metrics: list[str]
    rows: list[tuple[Cell, dict[str, Spread], int]]  # cell, metric -> spread, runs found
    per_run: tuple[tuple[PlannedRun, dict[str, float]], ...] = ()

    @classmethod
    def of(cls, spec: SweepSpec, runs: list[PlannedRun]) -> "Table":
        found = [(run, run.scores(spec.evaluate)) for run in runs if run.state(spec.evaluate) == "finished"]
        metrics = list(spec.metrics) or _default_metrics([scores for _, scores in found], spec.evaluate)
        rows = []
        for cell in spec.cells():
            mine = [scores for run, scores in found if run.cell == cell]
            rows.append(
                (
                    cell,
                    {m: Spread(tuple(s[m] for s in mine if m in s)) for m in metrics if any(m in s for s in mine)},
                    len(mine),
                )
            )
        return cls(spec.axes, metrics, [row for row in rows if row[2]], tuple(found))

    def markdown(self) -> str:
        head = [*self.axes, *(f"{m} (mean ± sd)" for m in self.metrics), "runs"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for cell, spreads, n in self.rows:
            values = [cell.shown(a) for a in self.axes]
            lines.append(
                "| "
                + " | ".join([*values, *(str(spreads[m]) if m in spreads else "-" for m in self.metrics), str(n)])
                + " |"
            )
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([*self.axes, *(f"{m}_{s}" for m in self.metrics for s in ("mean", "std", "min", "max", "n"))])
        for cell, spreads, _ in self.rows:
            cols: list[object] = []
            for m in self.metrics:
                s = spreads.get(m)
                cols += (
                    ["", "", "", "", 0]
                    if s is None
                    else [s.mean, "" if s.std is None else s.std, min(s.values), max(s.values), len(s.values)]
                )
            writer.writerow([*(_csv_value(cell, a) for a in self.axes), *cols])
        return buffer.getvalue()

    def runs_csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([*self.axes, "seed", "run", *self.metrics])
        for run, scores in self.per_run:
            writer.writerow(
                [
                    *(_csv_value(run.cell, a) for a in self.axes),
                    run.seed,
                    run.path,
                    *(scores.get(m, "") for m in self.metrics),
                ]
            )
        return buffer.getvalue()


def _csv_value(cell: Cell, axis: str) -> Any:
    return cell.shown(axis) if isinstance(cell.value(axis), tuple) else cell.value(axis)


def _default_metrics(found: list[dict[str, float]], evaluate: Evaluation | None) -> list[str]:
    """Every numeric score of the evaluation, if any; else the summary's best_* fields, then its
    last validation's."""
    if not found:
        return []
    if evaluate is not None:
        return [k for k in found[0] if k.startswith(f"{evaluate.split}_")]
    scores = [k for k in found[0] if k not in _SUMMARY_COUNTS]
    return sorted(scores, key=lambda k: not k.startswith("best_"))  # stable: best_* first


_SUMMARY_COUNTS = (
    "n_params",
    "steps",
    "epochs",
    "train_seconds",
    "best_step",
    "skipped_steps",
    *(key for unit in ("tokens", "examples", "values") for key in (f"train_{unit}", f"{unit}_per_s")),
)


def write_results(table: Table, out: Path) -> list[Path]:
    """results.md, results.csv, runs.csv and results.png in ``out``."""
    from attnlab.analysis.result_plots import sweep_plot

    files = []
    for name, text in (("results.md", table.markdown()), ("results.csv", table.csv()), ("runs.csv", table.runs_csv())):
        atomic_write_text(out / name, text)
        files.append(out / name)
    if table.metrics and table.axes:
        files.append(sweep_plot(table, out / "results.png"))
    return files
