"""A sweep: one base config trained over a grid of ``--set`` overrides x seeds, and its results table.

A sweep spec is a YAML file with one section, ``sweep``::

    sweep:
      config: configs/scan.yaml           # the base config; a list of configs is a grid axis of its own
      set: [data.split=length]            # overrides of every run
      grid:                               # the cells: every combination of these values
        model.n_heads: [1, 4]
        model.positional: [sinusoidal, rope]
        train.lr,train.warmup_steps: [[1.0e-3, 1], [5.0e-5, 199]]   # a joint axis: fields that change together
      seeds: 3                            # seeds 1, 2, 3 of every cell (or a list of seeds)
      steps: 300                          # the step budget of each run: train.max_steps
      evaluate: {split: test, args: [--beam, 4]}   # optional: score each run with `attnlab evaluate`
      metrics: [test_exact_match]         # the table's columns (default: the evaluation's scores, or the
                                          # summary's best_* and last validation scores)
      jobs: 1                             # runs at a time

Paths in the spec are read from the current directory, as ``attnlab train`` reads a config's.

Every run is an ordinary run directory, OUT/CELL/seedK (CELL names the cell's values, e.g.
``n_heads=4,positional=rope``), trained by ``attnlab train`` in a process of its own, its output in
OUT/logs. The sweep is resumable: a run with its summary.json (and its evaluation) is kept, a run
that was stopped goes on from its newest checkpoint (``train --resume``), and a run directory that
was trained with another config than the spec now gives is refused before anything starts. The
table (OUT/results.md, results.csv; every run's scores in runs.csv; results.png) has the mean,
standard deviation, minimum and maximum over seeds of each metric per cell, read from the runs'
summary.json (its ``best_*`` fields and its last validation's scores) and from their evaluation
(each score named after the split: test_exact_match).
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from attnlab.config import differences, dump_yaml, parse_file, parse_yaml
from attnlab.errors import AttnlabError, ConfigError, Interrupted, UsageError
from attnlab.files import atomic_write_text

CONFIG_AXIS = "config"
SPEC_FIELDS = ("config", "set", "grid", "seeds", "steps", "evaluate", "metrics", "jobs")
Scalar = str | int | float | bool | None


# -- the spec ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Evaluation:
    """``attnlab evaluate RUN --split SPLIT --json ARGS`` after training; its scores are the run's."""

    split: str
    args: tuple[str, ...] = ()

    def argv(self, run: Path) -> list[str]:
        return ["evaluate", str(run), "--split", self.split, "--json", *self.args]


@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep spec (the module's docstring has the format)."""

    path: Path
    configs: tuple[str, ...]
    sets: tuple[str, ...]
    grid: tuple[tuple[str, tuple[Any, ...]], ...]  # (axis, values) in the spec's order
    seeds: tuple[int, ...]
    steps: int | None = None
    evaluate: Evaluation | None = None
    metrics: tuple[str, ...] = ()
    jobs: int = 1

    @classmethod
    def from_file(cls, path: str | Path) -> "SweepSpec":
        path = Path(path)
        sections = parse_file(path, "sweep spec")
        if not isinstance(sections, dict) or set(sections) != {"sweep"} or not isinstance(sections["sweep"], dict):
            raise ConfigError(f"{path}: a sweep spec is one mapping, 'sweep:', with the fields {', '.join(SPEC_FIELDS)}")
        try:
            return cls.from_dict(path, sections["sweep"])
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None

    @classmethod
    def from_dict(cls, path: Path, spec: dict[str, Any]) -> "SweepSpec":
        from attnlab.config import did_you_mean

        for key in spec:
            if key not in SPEC_FIELDS:
                raise ConfigError(f"unknown field 'sweep.{key}'{did_you_mean(str(key), SPEC_FIELDS)}")
        if "config" not in spec:
            raise ConfigError("sweep.config: the base config file is missing")
        configs = _strings("sweep.config", spec["config"])
        grid = _grid(spec.get("grid") or {})
        if len(configs) > 1:
            grid = ((CONFIG_AXIS, configs), *grid)
        seeds = spec.get("seeds", 1)
        if isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 1:
            seeds = list(range(1, seeds + 1))
        if not isinstance(seeds, list) or not seeds or not all(_is_int(s) for s in seeds) or len(set(seeds)) < len(seeds):
            raise ConfigError(f"sweep.seeds must be a number of seeds (>= 1) or a list of distinct integers (got {seeds!r})")
        steps = spec.get("steps")
        if steps is not None and not (_is_int(steps) and steps >= 1):
            raise ConfigError(f"sweep.steps must be a number of steps >= 1 (got {steps!r})")
        jobs = spec.get("jobs", 1)
        if not (_is_int(jobs) and jobs >= 1):
            raise ConfigError(f"sweep.jobs must be an integer >= 1 (got {jobs!r})")
        return cls(path, configs, _strings("sweep.set", spec.get("set") or []), grid, tuple(seeds), steps,
                   _evaluation(spec.get("evaluate")), _strings("sweep.metrics", spec.get("metrics") or []), jobs)

    @property
    def axes(self) -> list[str]:
        return [axis for axis, _ in self.grid]

    def cells(self) -> list["Cell"]:
        """Every combination of the grid's values, the first axis slowest."""
        combos = itertools.product(*(values for _, values in self.grid))
        return [Cell(tuple(zip(self.axes, combo)), _short_names(self.axes)) for combo in combos]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _strings(field: str, value: Any) -> tuple[str, ...]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values) or not values and field == "sweep.config":
        raise ConfigError(f"{field} must be a string or a list of strings (got {value!r})")
    return tuple(values)


def _grid(grid: Any) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """The grid's axes: ``section.field: [values]``, or a joint axis ``a.x,b.y: [[x1, y1], [x2, y2]]``
    whose fields change together."""
    if not isinstance(grid, dict):
        raise ConfigError(f"sweep.grid must map config fields (section.field) to lists of values (got {grid!r})")
    axes = []
    for axis, values in grid.items():
        fields = axis_fields(str(axis))
        for field in fields:
            section, dot, name = field.partition(".")
            if not dot or section not in ("model", "data", "train") or not name:
                raise ConfigError(f"sweep.grid: '{field}' is not a config field (section.field, e.g. model.n_heads)")
            if field in ("train.seed", "train.max_steps"):
                raise ConfigError(f"sweep.grid: {field} is set by sweep.{'seeds' if field == 'train.seed' else 'steps'}")
        if not isinstance(values, list) or not values or len(set(map(repr, values))) < len(values):
            raise ConfigError(f"sweep.grid.{axis} must be a list of distinct values (got {values!r})")
        for value in values:
            each = value if len(fields) > 1 and isinstance(value, list) and len(value) == len(fields) else [value]
            if len(fields) > 1 and each == [value] or any(isinstance(v, (list, dict)) for v in each):
                wanted = f"a list of {len(fields)} values, one per field" if len(fields) > 1 else \
                    "a number, a string, true/false or null"
                raise ConfigError(f"sweep.grid.{axis}: each value must be {wanted} (got {value!r})")
        axes.append((str(axis), tuple(tuple(v) if len(fields) > 1 else v for v in values)))
    return tuple(axes)


def axis_fields(axis: str) -> list[str]:
    """The config fields an axis sets: one, or several joined by commas."""
    return [field.strip() for field in axis.split(",")]


def _evaluation(value: Any) -> Evaluation | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = {"split": value}
    if not isinstance(value, dict) or not isinstance(value.get("split"), str) or set(value) - {"split", "args"}:
        raise ConfigError(f"sweep.evaluate must be a split name or {{split: NAME, args: [...]}} (got {value!r})")
    args = value.get("args") or []
    if not isinstance(args, list) or any(isinstance(a, (list, dict)) for a in args):
        raise ConfigError(f"sweep.evaluate.args must be a list of command-line words (got {args!r})")
    return Evaluation(value["split"], tuple(_word(a) for a in args))


def _word(value: Scalar) -> str:
    """A YAML scalar written as ``--set`` and the command line read it back."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, str):
        return value if parse_yaml(value) == value else json.dumps(value)
    return repr(value)


def _short_names(axes: Sequence[str]) -> dict[str, str]:
    """Each field as a run directory names it: alone, or section.field where two axes share it."""
    fields = [field for axis in axes for field in axis_fields(axis)]
    names = [field.partition(".")[2] or field for field in fields]
    return {field: name if names.count(name) == 1 else field for field, name in zip(fields, names)}


@dataclass(frozen=True)
class Cell:
    """One combination of the grid's values (a joint axis's value is a tuple)."""

    values: tuple[tuple[str, Any], ...]
    short: dict[str, str]

    def __hash__(self) -> int:
        return hash(self.values)

    def settings(self) -> list[tuple[str, Scalar]]:
        """(field, value) of every field the cell sets, joint axes spread out."""
        return [pair for axis, v in self.values
                for pair in (zip(axis_fields(axis), v) if isinstance(v, tuple) else [(axis, v)])]

    @property
    def name(self) -> str:
        if not self.values:
            return "base"
        parts = [f"{self.short[field]}={Path(str(v)).stem if field == CONFIG_AXIS else _word(v)}"
                 for field, v in self.settings()]
        return "".join(c if c.isalnum() or c in "._=,+-" else "_" for c in ",".join(parts))

    def value(self, axis: str) -> Any:
        return dict(self.values)[axis]

    def shown(self, axis: str) -> str:
        """The axis's value as the table writes it."""
        v = self.value(axis)
        return ", ".join(map(_word, v)) if isinstance(v, tuple) else _word(v)

    def overrides(self) -> list[str]:
        return [f"{field}={_word(v)}" for field, v in self.settings() if field != CONFIG_AXIS]


# -- the plan ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlannedRun:
    cell: Cell
    seed: int
    config: str
    sets: tuple[str, ...]
    path: Path

    @property
    def name(self) -> str:
        return f"{self.cell.name}/seed{self.seed}"

    @property
    def evaluation_file(self) -> Path:
        return self.path / "sweep_evaluation.json"

    def state(self, evaluate: Evaluation | None) -> str:
        """'finished', 'evaluate' (trained, not yet scored), 'resume' (stopped) or 'train' (not begun)."""
        if (self.path / "summary.json").is_file():
            if evaluate is None or self.evaluated_with(evaluate):
                return "finished"
            return "evaluate"
        return "resume" if (self.path / "config.yaml").is_file() else "train"

    def evaluated_with(self, evaluate: Evaluation) -> bool:
        try:
            return json.loads(self.evaluation_file.read_text())["argv"] == evaluate.argv(self.path)
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def scores(self, evaluate: Evaluation | None) -> dict[str, float]:
        """The run's numeric scores: its evaluation's, named SPLIT_SCORE (test_exact_match), then
        its summary's (best_* and the last validation's)."""
        summary = json.loads((self.path / "summary.json").read_text())
        found = {**summary.get("last_eval", {}), **summary}
        if evaluate is not None:
            result = json.loads(self.evaluation_file.read_text())["result"]
            found = {f"{evaluate.split}_{k}": v for k, v in result.items()} | found
        return {k: float(v) for k, v in found.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def plan(spec: SweepSpec, out: Path) -> list[PlannedRun]:
    """Every run of the sweep, each config checked (and an existing run's against its own)."""
    runs = []
    for cell in spec.cells():
        config = str(cell.value(CONFIG_AXIS)) if CONFIG_AXIS in spec.axes else spec.configs[0]
        for seed in spec.seeds:
            budget = [f"train.max_steps={spec.steps}"] if spec.steps is not None else []
            sets = (*spec.sets, *cell.overrides(), f"train.seed={seed}", *budget)
            runs.append(PlannedRun(cell, seed, config, sets, out / cell.name / f"seed{seed}"))
    for run in runs:
        _check_config(run)
    return runs


def _check_config(run: PlannedRun) -> None:
    """Refuse a config that does not build, and a run directory trained with another config."""
    from attnlab.train.checkpoint import RunDir
    from attnlab.train.config import RunConfig

    try:
        planned = RunConfig.from_file(run.config, run.sets)
    except AttnlabError as err:
        raise ConfigError(f"sweep run {run.name}: {err}") from None
    if not (run.path / "config.yaml").is_file():
        if run.path.exists() and any(run.path.iterdir()):
            raise UsageError(f"{run.path} is in the sweep's way: it is not a run directory; remove it or choose "
                             f"another --out")
        return
    model, data, train = RunDir(run.path).read_config()
    changed = differences(data, planned.data) + differences(train, planned.train)
    if not changed:
        from_data = {k: getattr(model, k) for k in planned.data.task.sets if hasattr(model, k)}
        changed = differences(model, planned.model_config(from_data))
    if changed:
        raise UsageError(f"{run.path} was trained with another config than the sweep's ({'; '.join(changed)}); "
                         f"remove it, or give the sweep another --out")


# -- running -----------------------------------------------------------------------------------------

ATTNLAB = (sys.executable, "-m", "attnlab.cli")


class Launcher:
    """Runs the steps of the sweep's runs as `attnlab` processes, ``jobs`` at a time, each with its
    share of the CPU's threads; Ctrl-C or SIGTERM stops them and the sweep."""

    def __init__(self, jobs: int, logs: Path):
        self.jobs, self.logs = jobs, logs
        self.env = dict(os.environ)
        if jobs > 1 and "OMP_NUM_THREADS" not in self.env:
            self.env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
        self.live: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.stopped = False

    def attnlab(self, argv: list[str], log: Path, stdout: Path | None = None) -> int:
        """``attnlab ARGV``'s exit status; its stderr (and stdout, unless ``stdout``) appended to ``log``."""
        with open(log, "a", encoding="utf-8") as err, open(stdout or os.devnull, "w", encoding="utf-8") as out:
            err.write(f"$ attnlab {' '.join(argv)}\n")
            err.flush()
            with self.lock:
                if self.stopped:
                    return Interrupted.exit_code
                process = subprocess.Popen([*ATTNLAB, *argv], stdout=out if stdout else err, stderr=err, env=self.env)
                self.live.add(process)
            try:
                return process.wait()
            finally:
                with self.lock:
                    self.live.discard(process)

    def stop(self) -> None:
        """End the running trainings (SIGTERM: a process started in the background ignores SIGINT);
        each resumes from its newest checkpoint."""
        with self.lock:
            self.stopped = True
            for process in self.live:
                process.terminate()
        for process in list(self.live):
            process.wait()


def _execute(run: PlannedRun, state: str, evaluate: Evaluation | None, launcher: Launcher) -> str | None:
    """Train (or resume) and evaluate one run; None, or why it failed."""
    log = launcher.logs / f"{run.name.replace('/', '.')}.log"
    if state in ("train", "resume"):
        argv = (["train", run.config, "--out", str(run.path), *(w for s in run.sets for w in ("--set", s))]
                if state == "train" else ["train", "--out", str(run.path), "--resume"])
        code = launcher.attnlab(argv, log)
        if code != 0:
            return f"training exited with {code}: {_last_line(log)} (log: {log})"
    if evaluate is not None:
        result = log.with_suffix(".evaluation.json")
        code = launcher.attnlab(evaluate.argv(run.path), log, stdout=result)
        if code != 0:
            return f"evaluation exited with {code}: {_last_line(log)} (log: {log})"
        scores = json.loads(result.read_text())
        atomic_write_text(run.evaluation_file, json.dumps({"argv": evaluate.argv(run.path), "result": scores}))
        result.unlink()
    return None


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


@dataclass
class SweepOutcome:
    runs: list[PlannedRun]
    failed: dict[str, str]  # run name -> why
    table: "Table"
    files: list[Path]


def run_sweep(spec: SweepSpec, out: Path, jobs: int | None = None, dry_run: bool = False, report_only: bool = False,
              log: Callable[[str], None] = print) -> SweepOutcome:
    """Train what the sweep still lacks (or, ``dry_run``, say what that is) and write its table."""
    runs = plan(spec, out)
    jobs = jobs or spec.jobs
    states = {run.name: run.state(spec.evaluate) for run in runs}
    counts = {s: sum(1 for v in states.values() if v == s) for s in ("finished", "evaluate", "resume", "train")}
    log(f"sweep {spec.path}: {len(spec.cells())} cells x {len(spec.seeds)} seeds = {len(runs)} runs in {out} "
        f"({counts['finished']} finished, {counts['resume']} to resume, {counts['train']} to train, "
        f"{counts['evaluate']} to evaluate), {jobs} at a time")
    if dry_run:
        for run in runs:
            log(f"  {states[run.name]:8} {run.path}: attnlab train {run.config} " + " ".join(f"--set {s}" for s in run.sets))
        return SweepOutcome(runs, {}, Table([], [], []), [])
    failed: dict[str, str] = {}
    todo = [run for run in runs if states[run.name] != "finished"] if not report_only else []
    if todo:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "sweep.yaml", dump_yaml({"sweep": _spec_record(spec)}))
        (out / "logs").mkdir(exist_ok=True)
        launcher = Launcher(jobs, out / "logs")
        done = 0
        with ThreadPoolExecutor(max_workers=jobs) as pool, _terminate_as_interrupt():
            futures = {pool.submit(_execute, run, states[run.name], spec.evaluate, launcher): run for run in todo}
            try:
                for future in as_completed(futures):
                    run, done = futures[future], done + 1
                    why = future.result()
                    if why:
                        failed[run.name] = why
                        log(f"[{done}/{len(todo)}] {run.name}: failed, {why}")
                    else:
                        log(f"[{done}/{len(todo)}] {run.name}: " + _brief(run.scores(spec.evaluate), spec.metrics))
            except KeyboardInterrupt:
                pool.shutdown(wait=False, cancel_futures=True)
                launcher.stop()
                raise Interrupted(f"sweep interrupted; finished runs are kept, and `attnlab sweep {spec.path} --out "
                                  f"{out}` goes on from where it stopped") from None
    table = Table.of(spec, runs)
    files = write_results(table, out) if table.rows else []
    return SweepOutcome(runs, failed, table, files)


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM (kill, a job scheduler) stops the sweep as Ctrl-C does, with its runs, instead of
    leaving them to train on without it."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _brief(scores: dict[str, float], metrics: Sequence[str]) -> str:
    shown = [m for m in metrics if m in scores] or [k for k in scores if k.startswith("best_") and k != "best_step"]
    return ", ".join(f"{m} {scores[m]:.4g}" for m in shown) or "done"


def _spec_record(spec: SweepSpec) -> dict[str, Any]:
    return {"config": list(spec.configs), "set": list(spec.sets), "grid": {a: [list(x) if isinstance(x, tuple) else x for x in v] for a, v in spec.grid},
            "seeds": list(spec.seeds), "steps": spec.steps, "metrics": list(spec.metrics), "jobs": spec.jobs,
            "evaluate": None if spec.evaluate is None else {"split": spec.evaluate.split, "args": list(spec.evaluate.args)}}


# -- the table ---------------------------------------------------------------------------------------

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
            rows.append((cell, {m: Spread(tuple(s[m] for s in mine if m in s)) for m in metrics
                                if any(m in s for s in mine)}, len(mine)))
        return cls(spec.axes, metrics, [row for row in rows if row[2]], tuple(found))

    def markdown(self) -> str:
        head = [*self.axes, *(f"{m} (mean ± sd)" for m in self.metrics), "runs"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for cell, spreads, n in self.rows:
            values = [cell.shown(a) for a in self.axes]
            lines.append("| " + " | ".join([*values, *(str(spreads[m]) if m in spreads else "-" for m in self.metrics),
                                            str(n)]) + " |")
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([*self.axes, *(f"{m}_{s}" for m in self.metrics for s in ("mean", "std", "min", "max", "n"))])
        for cell, spreads, _ in self.rows:
            cols = []
            for m in self.metrics:
                s = spreads.get(m)
                cols += ["", "", "", "", 0] if s is None else [s.mean, "" if s.std is None else s.std, min(s.values),
                                                               max(s.values), len(s.values)]
            writer.writerow([*(_csv_value(cell, a) for a in self.axes), *cols])
        return buffer.getvalue()

    def runs_csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([*self.axes, "seed", "run", *self.metrics])
        for run, scores in self.per_run:
            writer.writerow([*(_csv_value(run.cell, a) for a in self.axes), run.seed, run.path,
                             *(scores.get(m, "") for m in self.metrics)])
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


_SUMMARY_COUNTS = ("n_params", "steps", "epochs", "train_seconds", "train_tokens", "tokens_per_s", "best_step",
                   "skipped_steps")


def write_results(table: Table, out: Path) -> list[Path]:
    """results.md, results.csv, runs.csv and results.png in ``out``."""
    from attnlab.analysis.plots import sweep_plot

    files = []
    for name, text in (("results.md", table.markdown()), ("results.csv", table.csv()), ("runs.csv", table.runs_csv())):
        atomic_write_text(out / name, text)
        files.append(out / name)
    if table.metrics and table.axes:
        files.append(sweep_plot(table, out / "results.png"))
    return files
