"""Run directories written before configs were composed (tests/fixtures/runs_f01/, made by
docs/experiments/runs_f01_fixture.py with that day's code: a flat model section) load, decode and
resume as they did then."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from attnlab.runs.checkpoint import load_run

from helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "runs_f01"
RUNS = ("encoder_decoder", "vit")


def fixture_script():
    spec = importlib.util.spec_from_file_location("runs_f01_fixture", ROOT / "docs/experiments/runs_f01_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.expected.json").read_text())


@pytest.mark.parametrize("name", RUNS)
def test_an_old_run_decodes_the_fixed_inputs_as_it_did_when_written(name):
    recorded = expected(name)["decoded"]
    now = fixture_script().decoded(FIXTURES / name)
    assert now["logits_sum"] == pytest.approx(recorded["logits_sum"], abs=1e-5)
    if name == "vit":
        torch.testing.assert_close(torch.tensor(now["probabilities"]), torch.tensor(recorded["probabilities"]),
                                   atol=1e-6, rtol=0)
    else:
        torch.testing.assert_close(torch.tensor(now["logits_first"]), torch.tensor(recorded["logits_first"]),
                                   atol=1e-5, rtol=0)
        assert now["translations"] == recorded["translations"] == "w w w\nk k k\n"


def test_an_old_run_resumes_one_step_as_it_did_when_written(tmp_path):
    run = tmp_path / "encoder_decoder"
    shutil.copytree(FIXTURES / "encoder_decoder", run)
    done = run_cli("train", "--out", str(run), "--resume", "--allow-changes", "--set", "train.max_steps=3")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("split") == "train"]
    recorded = expected("encoder_decoder")["resumed"]
    assert len(losses) == 3 and losses[2] == pytest.approx(recorded["step3_loss"], abs=1e-6)
    model, _, _ = load_run(run, "last")
    assert sum(p.double().sum().item() for p in model.parameters()) == pytest.approx(
        recorded["weights_sum_after"], abs=1e-5)


@pytest.mark.parametrize("name", RUNS)
def test_the_fixtures_config_is_the_flat_schema_of_its_day(name):
    """The fixture keeps what it is meant to test: a model section with the data's sizes in it."""
    model = yaml.safe_load((FIXTURES / name / "config.yaml").read_text())["model"]
    assert model["arch"] == name and "stack" in model
    assert ("vocab_size" in model) if name == "encoder_decoder" else ({"image_height", "n_classes"} <= set(model))
