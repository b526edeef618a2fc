"""The RNN-vs-Transformer benchmark: the models it times are the presets', and its records are sound."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnlab.bench.models import MODELS, REFERENCE, bench_models

ROOT = Path(__file__).resolve().parents[1]
ATTNLAB = Path(sys.executable).parent / "attnlab"
PRESETS = {"transformer": "multi30k_de_en", "gru_bahdanau": "rnn_bahdanau", "gru_fixed_context": "rnn_fixed_context"}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_benchmarked_models_are_the_presets(name):
    preset = yaml.safe_load((ROOT / "configs" / f"{PRESETS[name]}.yaml").read_text())
    assert MODELS[name] == preset["model"]
    assert preset["data"]["vocab_size"] == 8000


def test_records_carry_the_transformer_as_reference():
    records = list(bench_models(lengths=(3, 5), batch_tokens=12, decode_batch=2, repeats=1))
    assert [(r["name"], r["model"], r["seq_len"]) for r in records] == [
        (kind, model, T) for T in (3, 5) for model in MODELS for kind in ("train", "decode")]
    by_key = {(r["name"], r["model"], r["seq_len"]): r for r in records}
    for r in records:
        assert r["unit"] == "tokens/s" and r["value"] > 0 and r["precision"] == "fp32"
        assert r["batch"] == (12 // r["seq_len"] if r["name"] == "train" else 2)
        if r["model"] == REFERENCE:
            assert "ratio" not in r
        else:
            reference = by_key[r["name"], REFERENCE, r["seq_len"]]["value"]
            assert r["reference"] == REFERENCE and r["ratio"] == pytest.approx(r["value"] / reference, rel=0.01)


def test_cli_bench_models_json_and_bad_arguments():
    done = subprocess.run([str(ATTNLAB), "bench", "models", "--lengths", "4", "--models", "transformer",
                           "gru_bahdanau", "--batch-tokens", "8", "--decode-batch", "1", "--repeats", "1",
                           "--precision", "bf16", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert {(r["name"], r["model"]) for r in records} == {
        (k, m) for k in ("train", "decode") for m in ("transformer", "gru_bahdanau")}
    assert all(r["precision"] == "bf16" for r in records)
    for bad, says in ((["--models", "lstm"], "unknown model 'lstm'"), (["--lengths", "0"], "at least 1")):
        refused = subprocess.run([str(ATTNLAB), "bench", "models", *bad], capture_output=True, text=True)
        assert refused.returncode == 2 and says in refused.stderr and "Traceback" not in refused.stderr
