"""A sweep: one base config trained over a grid of ``--set`` overrides x seeds, and its results table.

A sweep spec is a YAML file with one section, ``sweep``::

    sweep:
      config: configs/scan.yaml           # the base config; a list of configs is a grid axis of its own
      set: [data.generator.split=length]            # overrides of every run
      grid:                               # the cells: every combination of these values
        model.stack.n_heads: [1, 4]
        model.positions.scheme: [sinusoidal, rope]
        train.lr,train.warmup_steps: [[1.0e-3, 1], [5.0e-5, 199]]   # a joint axis: fields that change together
      seeds: 3                            # seeds 1, 2, 3 of every cell (or a list of seeds)
      steps: 300                          # the step budget of each run: train.max_steps
      evaluate: {split: test, args: [--beam, 4]}   # optional: score each run with `attnlab evaluate`
      metrics: [test_exact_match]         # the table's columns (default: the evaluation's scores, or the
                                          # summary's best_* and last validation scores)
      jobs: 1                             # runs at a time

Paths in the spec are read from the current directory, as ``attnlab train`` reads a config's.

Every run is an ordinary run directory, OUT/CELL/seedK (CELL names the cell's values, e.g.
``n_heads=4,scheme=rope``; a spec whose two cells would get one name is refused), trained by
``attnlab train`` in a process of its own, its output in OUT/logs. The sweep is resumable: a run
with its summary.json (and its evaluation) is kept, a run that was stopped goes on from its newest
checkpoint (``train --resume``), and a run directory that was trained with another config than the
spec now gives is refused before anything starts. The table (OUT/results.md, results.csv; every
run's scores in runs.csv; results.png) has the mean, standard deviation, minimum and maximum over
seeds of each metric per cell, read from the runs' summary.json (its ``best_*`` fields and its last
validation's scores) and from their evaluation (each score named after the split:
test_exact_match): analysis/sweep_table.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from attnlab.analysis.sweep_spec import CONFIG_AXIS, Evaluation, PlannedRun, SweepSpec
from attnlab.analysis.sweep_table import Table, write_results
from attnlab.config import differences
from attnlab.config_files import dump_yaml
from attnlab.errors import AttnlabError, ConfigError, Interrupted, UsageError
from attnlab.files import atomic_write_text

# -- the plan ----------------------------------------------------------------------------------------


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
    from attnlab.runs.config import RunConfig
    from attnlab.runs.run_dir import RunDir

    try:
        planned = RunConfig.from_file(run.config, run.sets)
    except AttnlabError as err:
        raise ConfigError(f"sweep run {run.name}: {err}") from None
    if not (run.path / "config.yaml").is_file():
        if run.path.exists() and any(run.path.iterdir()):
            raise UsageError(
                f"{run.path} is in the sweep's way: it is not a run directory; remove it or choose another --out"
            )
        return
    model, data, train = RunDir(run.path).read_config()
    changed = differences(data, planned.data) + differences(train, planned.train) + differences(model, planned.model)
    if changed:
        raise UsageError(
            f"{run.path} was trained with another config than the sweep's ({'; '.join(changed)}); "
            f"remove it, or give the sweep another --out"
        )


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
        self.live: set[subprocess.Popen[bytes]] = set()
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
        argv = (
            ["train", run.config, "--out", str(run.path), *(w for s in run.sets for w in ("--set", s))]
            if state == "train"
            else ["train", "--out", str(run.path), "--resume"]
        )
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
    table: Table
    files: list[Path]


def run_sweep(
    spec: SweepSpec,
    out: Path,
    jobs: int | None = None,
    dry_run: bool = False,
    report_only: bool = False,
    log: Callable[[str], None] = print,
) -> SweepOutcome:
    """Train what the sweep still lacks (or, ``dry_run``, say what that is) and write its table."""
    runs = plan(spec, out)
    jobs = jobs or spec.jobs
    states = {run.name: run.state(spec.evaluate) for run in runs}
    counts = {s: sum(1 for v in states.values() if v == s) for s in ("finished", "evaluate", "resume", "train")}
    log(
        f"sweep {spec.path}: {len(spec.cells())} cells x {len(spec.seeds)} seeds = {len(runs)} runs in {out} "
        f"({counts['finished']} finished, {counts['resume']} to resume, {counts['train']} to train, "
        f"{counts['evaluate']} to evaluate), {jobs} at a time"
    )
    if dry_run:
        for run in runs:
            log(
                f"  {states[run.name]:8} {run.path}: attnlab train {run.config} "
                + " ".join(f"--set {s}" for s in run.sets)
            )
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
                raise Interrupted(
                    f"sweep interrupted; finished runs are kept, and `attnlab sweep {spec.path} --out "
                    f"{out}` goes on from where it stopped"
                ) from None
    table = Table.of(spec, runs)
    files = write_results(table, out) if table.rows else []
    return SweepOutcome(runs, failed, table, files)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (kill, a job scheduler) stops the sweep as Ctrl-C does, with its runs, instead of
    leaving them to train on without it."""

    def interrupt(signum: int, frame: object) -> None:
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
    return {
        "config": list(spec.configs),
        "set": list(spec.sets),
        "grid": {a: [list(x) if isinstance(x, tuple) else x for x in v] for a, v in spec.grid},
        "seeds": list(spec.seeds),
        "steps": spec.steps,
        "metrics": list(spec.metrics),
        "jobs": spec.jobs,
        "evaluate": None if spec.evaluate is None else {"split": spec.evaluate.split, "args": list(spec.evaluate.args)},
    }
