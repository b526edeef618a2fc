"""A long run is never silent and never loses more than a few minutes: a progress line at least every
minute whatever train.progress and log_every say, and a checkpoint (not evaluated) once
train.checkpoint_minutes pass without one. Both run on a fake wall clock, read once an update.
Every recipe says in its header how long it takes on 2 cores, and none stretches the checkpoints
beyond the default's 10 minutes."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
import yaml
from test_train import run_config, train_losses

import attnlab.train.loop as loop
from attnlab.errors import ConfigError
from attnlab.runs.run_dir import RunDir
from attnlab.runs.train_config import TrainConfig
from attnlab.train.progress import duration
from attnlab.train.run import train_run

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"step (\d+)/(\d+): loss (\S+), (\S+) tokens/s, ETA (.+)")


def seconds_per_update(seconds: float):
    """A wall clock that advances ``seconds`` each time the loop reads it (once an update)."""
    return itertools.count(0.0, seconds).__next__


def progress_lines(lines: list[str]) -> list[re.Match]:
    return [m for m in map(LINE.fullmatch, lines) if m]


@pytest.mark.parametrize("bar", [False, True])
def test_a_line_every_60_updates_at_1_second_each_whatever_the_bar_and_log_every(tmp_path, bar):
    cfg = run_config(train={"max_steps": 130, "log_every": 30, "eval_every": 1000, "progress": bar})
    lines: list[str] = []
    train_run(cfg, tmp_path / "run", log=lines.append, clock=seconds_per_update(1.0))
    beats = progress_lines(lines)
    assert [(int(m[1]), int(m[2])) for m in beats] == [(60, 130), (120, 130)]
    logged = train_losses(tmp_path / "run")  # the heartbeat's loss: the window of the train log line at its step
    assert [float(m[3]) for m in beats] == [float(f"{logged[60]:.4g}"), float(f"{logged[120]:.4g}")]
    assert [m[5] for m in beats] == ["1m 10s", "10s"]  # 70 and 10 updates left, at 1 s each


def test_a_line_every_update_at_61_seconds_each(tmp_path):
    cfg = run_config(train={"max_steps": 3, "log_every": 50, "eval_every": 1000})
    lines: list[str] = []
    summary = train_run(cfg, tmp_path / "run", log=lines.append, clock=seconds_per_update(61.0))
    beats = progress_lines(lines)
    assert [int(m[1]) for m in beats] == [1, 2, 3]
    assert [m[5] for m in beats] == ["2m 02s", "1m 01s", "0s"]
    # each line's rate: the tokens of its update over the 61 s since the line before
    tokens = sum(float(m[4].replace(",", "")) * 61 for m in beats)
    assert tokens == pytest.approx(summary["train_tokens"], abs=3 * 0.5 * 61)


def test_no_line_before_a_minute_has_passed(tmp_path):
    lines: list[str] = []
    train_run(
        run_config(train={"max_steps": 59, "eval_every": 1000}),
        tmp_path / "run",
        log=lines.append,
        clock=seconds_per_update(1.0),
    )
    assert progress_lines(lines) == []


@pytest.mark.parametrize(
    "seconds, said", [(0.4, "0s"), (45, "45s"), (59.6, "1m 00s"), (750, "12m 30s"), (3 * 3600 + 5 * 60 + 20, "3h 05m")]
)
def test_durations_read_as_a_person_says_them(seconds, said):
    assert duration(seconds) == said


def checkpoint_meta(run: RunDir, step: int) -> dict:
    return json.loads((run.step_dir(step) / "meta.json").read_text())


def test_a_checkpoint_every_half_minute_of_updates_however_rare_the_evaluations(tmp_path):
    """At 1 s an update and checkpoint_minutes 0.5: a checkpoint 30 s after the last one, evaluated
    (every 40 steps) or not; those not evaluated say 'periodic', have no metrics and never become
    best, and keep_last prunes them like any other (never the best)."""
    train = {
        "max_steps": 100,
        "eval_every": 40,
        "checkpoint_minutes": 0.5,
        "eval_exact_match": 0,
        "early_stop_metric": "valid_loss",
    }
    train_run(
        run_config(train={**train, "keep_last": 10}),
        tmp_path / "run",
        log=lambda s: None,
        clock=seconds_per_update(1.0),
    )
    run = RunDir(tmp_path / "run")
    assert run.steps() == [30, 40, 70, 80, 100]
    for step in (30, 70):
        assert checkpoint_meta(run, step)["periodic"] is True and run.metrics_at(step) == {}
    for step in (40, 80, 100):
        assert "periodic" not in checkpoint_meta(run, step) and "valid_loss" in run.metrics_at(step)
    best = json.loads(run.best_pointer.read_text())
    evaluated = {step: run.metrics_at(step)["valid_loss"] for step in (40, 80, 100)}
    assert best == {"step": min(evaluated, key=evaluated.get), "metric": "valid_loss", "value": min(evaluated.values())}

    pruned = tmp_path / "pruned"
    train_run(run_config(train={**train, "keep_last": 1}), pruned, log=lambda s: None, clock=seconds_per_update(1.0))
    assert RunDir(pruned).steps() == sorted({RunDir(pruned).best_step(), 100})


def test_a_crash_after_a_periodic_checkpoint_resumes_from_it_as_if_never_stopped(tmp_path, monkeypatch):
    """eval_every far beyond the run: only the periodic checkpoint (step 30) survives a crash at
    update 45; the resumed run logs the losses of a run that never stopped and had no periodic
    checkpoint (dropout on: the RNG state comes back too), so writing one changes no number."""
    train = {
        "max_steps": 60,
        "eval_every": 100_000,
        "log_every": 5,
        "eval_exact_match": 0,
        "early_stop_metric": "valid_loss",
        "checkpoint_minutes": 0.5,
    }
    model = {"stack": {"dropout": 0.1}}
    whole = tmp_path / "whole"
    train_run(
        run_config(model, None, {**train, "checkpoint_minutes": 10_000}),
        whole,
        log=lambda s: None,
        clock=seconds_per_update(1.0),
    )
    assert RunDir(whole).steps() == [60]

    real_step, updates = loop.train_step, itertools.count(1)

    def crashing_step(*args, **kwargs):
        if next(updates) == 45:
            raise RuntimeError("the machine went away")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", crashing_step)
    parts = tmp_path / "parts"
    with pytest.raises(RuntimeError, match="went away"):
        train_run(run_config(model, None, train), parts, log=lambda s: None, clock=seconds_per_update(1.0))
    assert RunDir(parts).steps() == [30]
    monkeypatch.setattr(loop, "train_step", real_step)
    lines: list[str] = []
    train_run(run_config(model, None, train), parts, resume=True, log=lines.append)
    assert f"resuming {parts} from step 30" in lines
    expected, got = train_losses(whole), train_losses(parts)
    assert sorted(got) == sorted(expected) == list(range(5, 61, 5))
    for step in got:
        assert got[step] == pytest.approx(expected[step], rel=1e-6, abs=1e-7), step


@pytest.mark.parametrize("minutes", [0, -1.5])
def test_checkpoint_minutes_must_be_positive(minutes):
    with pytest.raises(ConfigError, match=r"^checkpoint_minutes must be > 0 \(got -?[\d.]+\)"):
        TrainConfig(checkpoint_minutes=minutes)


RECIPES = sorted([*Path(ROOT, "recipes").glob("**/*.yaml"), *Path(ROOT, "configs").glob("*.yaml")])


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_recipe_says_its_time_on_2_cores_and_keeps_the_periodic_checkpoints(recipe):
    header = list(itertools.takewhile(lambda line: line.startswith("#"), recipe.read_text().splitlines()))
    assert any(line.startswith("# Time on 2 cores: ") for line in header)
    train = (yaml.safe_load(recipe.read_text()) or {}).get("train") or {}
    assert train.get("checkpoint_minutes", TrainConfig.checkpoint_minutes) <= TrainConfig.checkpoint_minutes
