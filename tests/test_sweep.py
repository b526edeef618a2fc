"""`attnlab sweep`: the spec and its one-line errors, the table's statistics, a 2 x 2 grid x 2 seeds
end to end (trained two at a time, resumed after losing runs, refused when the spec no longer matches
its runs), and a sweep with evaluation where one run fails."""

from __future__ import annotations

import csv
import json
import signal
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_forecasting import series_rows, write_series

from attnlab import ConfigError
from attnlab.analysis.sweep import plan
from attnlab.analysis.sweep_spec import CONFIG_AXIS, SweepSpec
from attnlab.analysis.sweep_table import Table
from attnlab.runs.config import RunConfig

from helpers import ATTNLAB, run_cli

BASE = """model: {arch: dlinear, kernel_size: 5}
data: {task: forecasting, path: series.csv, input_length: 24, horizon: 8, splits: {n_train: 100, n_valid: 40, n_test: 20}}
train: {batch_size: 16, lr_schedule: constant, lr: 0.01, eval_every: 4, progress: false, label_smoothing: 0.0}
"""

SPEC = """sweep:
  config: base.yaml
  grid:
    model.kernel_size: [3, 7]
    model.individual: [false, true]
  seeds: 2
  steps: 8
  jobs: 2
"""
EVALUATED = SPEC.replace("  jobs: 2", "  evaluate: valid\n  metrics: [valid_mse, best_valid_loss]\n  jobs: 2")
ROOT = Path(__file__).resolve().parents[1]
SHIPPED_SPECS = sorted(p for p in ROOT.glob("recipes/**/*.yaml") if set(yaml.safe_load(p.read_text())) == {"sweep"})


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder with a 160-row series, the base config and the spec; the current directory."""
    monkeypatch.chdir(tmp_path)
    write_series(tmp_path / "series.csv", series_rows(160))
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "spec.yaml").write_text(SPEC)
    return tmp_path


def spec_with(folder: Path, text: str) -> Path:
    (folder / "bad.yaml").write_text(text)
    return folder / "bad.yaml"


@pytest.mark.parametrize(
    "text, message",
    [
        ("sweep:\n  config: base.yaml\n  seed: 3\n", "bad.yaml: unknown field 'sweep.seed' (did you mean 'seeds'?)"),
        ("sweep:\n  grid: {model.stack.n_heads: [1, 2]}\n", "bad.yaml: sweep.config: the base config file is missing"),
        (
            "sweep:\n  config: base.yaml\n  grid: {n_heads: [1, 2]}\n",
            "bad.yaml: sweep.grid: 'n_heads' is not a config field",
        ),
        (
            "sweep:\n  config: base.yaml\n  grid: {model.kernel_size: 3}\n",
            "bad.yaml: sweep.grid.model.kernel_size must be a list of distinct values (got 3)",
        ),
        (
            "sweep:\n  config: base.yaml\n  grid: {train.seed: [1, 2]}\n",
            "bad.yaml: sweep.grid: train.seed is set by sweep.seeds",
        ),
        ("sweep:\n  config: base.yaml\n  seeds: [1, 1]\n", "bad.yaml: sweep.seeds must be a number of seeds"),
        ("sweep:\n  config: base.yaml\n  steps: 0\n", "bad.yaml: sweep.steps must be a number of steps >= 1 (got 0)"),
        ("model: {}\n", "bad.yaml: a sweep spec is one mapping, 'sweep:'"),
        ("sweep: [\n", "bad.yaml:2: YAML does not parse"),
    ],
)
def test_a_bad_spec_is_one_line_naming_the_file_and_field(folder, text, message):
    result = run_cli("sweep", str(spec_with(folder, text)))
    assert result.returncode == 3 and result.stderr.startswith(f"error: {folder / message}"), result.stderr
    assert result.stderr.count("\n") == 1 and not (folder / "runs").exists()


def test_a_cell_whose_config_does_not_build_is_refused_before_any_run_starts(folder):
    spec = spec_with(folder, SPEC.replace("[3, 7]", "[3, 0]"))
    result = run_cli("sweep", str(spec), "--out", "out")
    assert result.returncode == 3 and "sweep run kernel_size=0,individual=false/seed1:" in result.stderr
    assert not Path("out").exists()


def test_the_plan_is_the_grid_in_order_with_seeds_and_budget(folder):
    spec = SweepSpec.from_file("spec.yaml")
    runs = plan(spec, Path("out"))
    assert [r.name for r in runs[:3]] == [
        "kernel_size=3,individual=false/seed1",
        "kernel_size=3,individual=false/seed2",
        "kernel_size=3,individual=true/seed1",
    ]
    assert len(runs) == 8 and runs[-1].path == Path("out/kernel_size=7,individual=true/seed2")
    assert runs[2].sets == ("model.kernel_size=3", "model.individual=true", "train.seed=1", "train.max_steps=8")


def test_a_list_of_configs_is_an_axis_and_strings_stay_strings(folder):
    spec = SweepSpec.from_dict(
        Path("s.yaml"),
        {
            "config": ["base.yaml", "other/b.yaml"],
            "set": ["train.lr=0.1"],
            "grid": {"data.date_column": ["date", "true"]},
            "seeds": [5],
        },
    )
    assert spec.axes == ["config", "data.date_column"]
    cells = spec.cells()
    assert [c.name for c in cells] == [
        "config=base,date_column=date",
        "config=base,date_column=_true_",
        "config=b,date_column=date",
        "config=b,date_column=_true_",
    ]
    assert cells[1].overrides() == ['data.date_column="true"']  # the string 'true', not the boolean


def test_a_joint_axis_sets_its_fields_together(folder):
    spec = SweepSpec.from_dict(
        Path("s.yaml"),
        {
            "config": "base.yaml",
            "grid": {"train.lr,train.warmup_steps": [[1.0e-3, 1], [5.0e-5, 199]], "model.kernel_size": [3, 5]},
        },
    )
    cells = spec.cells()
    assert [c.name for c in cells] == [
        "lr=0.001,warmup_steps=1,kernel_size=3",
        "lr=0.001,warmup_steps=1,kernel_size=5",
        "lr=5e-05,warmup_steps=199,kernel_size=3",
        "lr=5e-05,warmup_steps=199,kernel_size=5",
    ]
    assert cells[2].overrides() == ["train.lr=5e-05", "train.warmup_steps=199", "model.kernel_size=3"]
    assert cells[2].shown("train.lr,train.warmup_steps") == "5e-05, 199"
    with pytest.raises(
        ConfigError,
        match=r"sweep.grid.train.lr,train.warmup_steps: each value must be a list of 2 "
        r"values, one per field \(got 0.001\)",
    ):
        SweepSpec.from_dict(Path("s.yaml"), {"config": "base.yaml", "grid": {"train.lr,train.warmup_steps": [1.0e-3]}})


def test_the_table_is_mean_and_sample_sd_over_seeds(folder):
    spec = SweepSpec.from_dict(
        Path("s.yaml"), {"config": "base.yaml", "grid": {"model.kernel_size": [3, 5]}, "seeds": 3}
    )
    runs = plan(spec, Path("out"))
    values = {run.name: 0.1 * i + 0.01 * i * i for i, run in enumerate(runs)}
    for run in runs[:-1]:  # the last run has not finished
        run.path.mkdir(parents=True)
        (run.path / "summary.json").write_text(
            json.dumps({"best_valid_loss": values[run.name], "steps": 8, "last_eval": {"valid_loss": 1.0, "mae": 2.0}})
        )
    table = Table.of(spec, runs)
    assert table.metrics == ["best_valid_loss", "valid_loss", "mae"]
    (three, five) = [row for row in table.rows]
    first = [values[r.name] for r in runs[:3]]
    assert three[1]["best_valid_loss"].mean == pytest.approx(statistics.fmean(first))
    assert three[1]["best_valid_loss"].std == pytest.approx(float(np.std(first, ddof=1)))
    assert five[2] == 2 and five[1]["best_valid_loss"].values == (values[runs[3].name], values[runs[4].name])
    lines = table.markdown().splitlines()
    assert (
        lines[0]
        == "| model.kernel_size | best_valid_loss (mean ± sd) | valid_loss (mean ± sd) | mae (mean ± sd) | runs |"
    )
    assert lines[2] == f"| 3 | {statistics.fmean(first):.4g} ± {np.std(first, ddof=1):.2g} | 1 ± 0 | 2 ± 0 | 3 |"


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_a_grid_of_two_by_two_cells_and_two_seeds_end_to_end_with_resume(folder):
    result = run_cli("sweep", "spec.yaml", "--out", "out")
    assert result.returncode == 0, result.stderr
    runs = plan(SweepSpec.from_file("spec.yaml"), Path("out"))
    assert all((r.path / "summary.json").is_file() for r in runs)
    rows = read_csv(Path("out/results.csv"))
    assert [(r["model.kernel_size"], r["model.individual"]) for r in rows] == [
        ("3", "False"),
        ("3", "True"),
        ("7", "False"),
        ("7", "True"),
    ]
    for row, cell in zip(rows, [runs[i : i + 2] for i in range(0, 8, 2)]):
        summaries = [json.loads((r.path / "summary.json").read_text()) for r in cell]
        for metric, values in (
            ("best_valid_loss", [s["best_valid_loss"] for s in summaries]),
            ("mae", [s["last_eval"]["mae"] for s in summaries]),
        ):
            assert float(row[f"{metric}_mean"]) == pytest.approx(statistics.fmean(values))
            assert float(row[f"{metric}_std"]) == pytest.approx(statistics.stdev(values))
            assert row[f"{metric}_n"] == "2"
    assert len(read_csv(Path("out/runs.csv"))) == 8 and Path("out/results.png").stat().st_size > 0
    assert Path("out/results.md").read_text() in result.stdout
    table = Path("out/results.csv").read_text()

    # resume: one run lost its summary (stopped after its checkpoints), one run is gone; the others stay
    stopped, gone, kept = runs[1], runs[6], runs[0]
    (stopped.path / "summary.json").unlink()
    for path in sorted(gone.path.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    gone.path.rmdir()
    kept_mtime = (kept.path / "summary.json").stat().st_mtime_ns
    again = run_cli("sweep", "spec.yaml", "--out", "out")
    assert again.returncode == 0, again.stderr
    assert "(6 finished, 1 to resume, 1 to train, 0 to evaluate)" in again.stdout
    assert (
        "resuming out/kernel_size=3,individual=false/seed2 from step 8"
        in Path("out/logs/kernel_size=3,individual=false.seed2.log").read_text()
    )
    assert (kept.path / "summary.json").stat().st_mtime_ns == kept_mtime
    assert Path("out/results.csv").read_text() == table  # the same seeds train the same numbers

    # a spec that no longer matches its runs is refused before anything starts
    Path("spec.yaml").write_text(SPEC.replace("steps: 8", "steps: 9"))
    changed = run_cli("sweep", "spec.yaml", "--out", "out")
    assert changed.returncode == 2 and changed.stderr == (
        "error: out/kernel_size=3,individual=false/seed1 was trained with another config than the sweep's "
        "(train.max_steps: 8 -> 9); remove it, or give the sweep another --out\n"
    )


def test_a_failed_run_is_reported_with_its_log_and_the_others_still_run(folder):
    # the subprocesses of the suite see no GPU (tests/conftest.py): a run on 'cuda' fails when it starts
    spec = spec_with(
        folder,
        EVALUATED.replace("model.individual: [false, true]", "train.device: [cpu, cuda]")
        .replace("seeds: 2", "seeds: 1")
        .replace("[3, 7]", "[3]"),
    )
    result = run_cli("sweep", str(spec), "--out", "out")
    assert result.returncode == 1
    assert result.stderr.startswith(
        "error: 1 of 2 runs failed; the first, kernel_size=3,device=cuda/seed1: training "
        "exited with 3: error: train.device is 'cuda' but no CUDA device is available"
    )
    assert result.stderr.endswith("(log: out/logs/kernel_size=3,device=cuda.seed1.log)\n")
    rows = read_csv(Path("out/results.csv"))
    assert [(r["train.device"], r["valid_mse_n"]) for r in rows] == [("cpu", "1")]
    scores = json.loads(Path("out/kernel_size=3,device=cpu/seed1/sweep_evaluation.json").read_text())
    assert scores["argv"][:4] == ["evaluate", "out/kernel_size=3,device=cpu/seed1", "--split", "valid"]
    assert float(rows[0]["valid_mse_mean"]) == scores["result"]["mse"]
    assert float(rows[0]["best_valid_loss_mean"]) == pytest.approx(scores["result"]["mse"])  # the same checkpoint


def running(marker: str) -> list[int]:
    """The pids of processes whose command line holds ``marker``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_sigterm_stops_the_sweep_and_its_runs_and_the_sweep_resumes(folder):
    spec = spec_with(
        folder,
        SPEC.replace("steps: 8", "steps: 1000000")
        .replace("seeds: 2", "seeds: 1")
        .replace("[3, 7]", "[3]")
        .replace("[false, true]", "[false]")
        .replace("jobs: 2", "jobs: 1"),
    )
    sweep = subprocess.Popen(
        [*ATTNLAB, "sweep", str(spec), "--out", "out"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    log = Path("out/logs/kernel_size=3,individual=false.seed1.log")
    for _ in range(600):  # until the run has written a checkpoint (eval_every 4 steps)
        if list(Path("out/kernel_size=3,individual=false/seed1/checkpoints").glob("step-*")):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the run wrote no checkpoint: " + (log.read_text() if log.exists() else "no log"))
    sweep.send_signal(signal.SIGTERM)
    out, err = sweep.communicate(timeout=60)
    assert sweep.returncode == 130 and err == (
        "\nsweep interrupted; finished runs are kept, and `attnlab sweep "
        f"{spec} --out out` goes on from where it stopped\n"
    )
    assert running(str(folder / "out")) == [] and running("--out out/kernel_size") == []  # no run trains on
    again = run_cli("sweep", str(spec), "--out", "out", "--dry-run")
    assert "(0 finished, 1 to resume, 0 to train, 0 to evaluate)" in again.stdout


def test_dry_run_lists_the_runs_and_trains_nothing(folder):
    result = run_cli("sweep", "spec.yaml", "--out", "out", "--dry-run")
    assert result.returncode == 0 and not Path("out").exists()
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "sweep spec.yaml: 4 cells x 2 seeds = 8 runs in out (0 finished, 0 to resume, 8 to train, "
        "0 to evaluate), 2 at a time"
    )
    assert lines[1] == (
        "  train    out/kernel_size=3,individual=false/seed1: attnlab train base.yaml "
        "--set model.kernel_size=3 --set model.individual=false --set train.seed=1 --set train.max_steps=8"
    )


def test_spec_errors_name_the_field_in_the_library_too(folder):
    with pytest.raises(ConfigError, match=r"sweep.jobs must be an integer >= 1 \(got 0\)"):
        SweepSpec.from_dict(Path("s.yaml"), {"config": "base.yaml", "jobs": 0})


def test_two_cells_that_would_share_a_run_directory_are_refused():
    """A run directory is named from the config's file name and the values' words, so two configs
    named alike in two folders, or values that differ only in characters a name cannot hold, collide."""
    with pytest.raises(
        ConfigError,
        match=r"sweep: the cells config=a/x.yaml and config=b/x.yaml would share the run "
        r"directory 'config=x' .*; rename one",
    ):
        SweepSpec.from_dict(Path("s.yaml"), {"config": ["a/x.yaml", "b/x.yaml"]})
    with pytest.raises(ConfigError, match=r"data.train=a/b and data.train=a_b would share the run directory"):
        SweepSpec.from_dict(Path("s.yaml"), {"config": "base.yaml", "grid": {"data.train": ["a/b", "a_b"]}})
    assert [c.name for c in SweepSpec.from_dict(Path("s.yaml"), {"config": ["a/x.yaml", "b/y.yaml"]}).cells()] == [
        "config=x",
        "config=y",
    ]


@pytest.mark.parametrize("path", SHIPPED_SPECS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_sweep_spec_builds_each_run_with_its_cells_values(path, tmp_path, monkeypatch):
    """The recipes' sweeps (run from the repository root, as their comments say): each run's config, built as `attnlab train` builds it, holds its cell's values,
    its seed and the spec's step budget."""
    monkeypatch.chdir(ROOT)
    spec = SweepSpec.from_file(str(path.relative_to(ROOT)))
    runs = plan(spec, tmp_path)
    for run in runs:
        built = RunConfig.from_file(run.config, run.sets)
        # the data section as it is written (a flattened part's fields in the section: data.n_train)
        sections = {"model": built.model, "data": built.data.to_dict(), "train": vars(built.train)}
        for field, value in run.cell.settings():
            if field != CONFIG_AXIS:
                section, *path = field.split(".")  # model.stack.n_heads: a field of the stack
                got = sections[section]
                for name in path:
                    got = got[name] if isinstance(got, dict) else getattr(got, name)
                assert got == value, (run.name, field)
        assert built.train.seed == run.seed
        assert spec.steps is None or built.train.max_steps == spec.steps


def test_the_shipped_sweep_specs_are_found():
    names = {str(p.relative_to(ROOT)) for p in SHIPPED_SPECS}
    assert {
        "recipes/claims/data_size_sweep.yaml",
        "recipes/claims/scan_splits_sweep.yaml",
        "recipes/extrapolation/sweep.yaml",
    } <= names and "recipes/claims/scan_gru.yaml" not in names
