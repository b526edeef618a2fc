"""The benchmarks: the RNN-vs-Transformer one times the presets' models, the attention one measures
what it says, and both report sound records."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from attnlab.bench.models import MODELS, REFERENCE, bench_models
from helpers import ATTNLAB, run_cli

ROOT = Path(__file__).resolve().parents[1]
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
    done = run_cli("bench", "models", "--lengths", "4", "--models", "transformer",
                           "gru_bahdanau", "--batch-tokens", "8", "--decode-batch", "1", "--repeats", "1",
                           "--precision", "bf16", "--json")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert {(r["name"], r["model"]) for r in records} == {
        (k, m) for k in ("train", "decode") for m in ("transformer", "gru_bahdanau")}
    assert all(r["precision"] == "bf16" for r in records)
    for bad, says in ((["--models", "lstm"], "unknown model 'lstm'"), (["--lengths", "0"], "at least 1")):
        refused = run_cli("bench", "models", *bad)
        assert refused.returncode == 2 and says in refused.stderr and "Traceback" not in refused.stderr


def test_peak_memory_counts_what_a_pass_allocates():
    from attnlab.bench.attention import measure_peak

    _, peak = measure_peak(lambda: torch.ones(16 * 2**20))  # 64 MiB of float32, returned (alive at the end)
    assert 64 * 2**20 <= peak < 72 * 2**20
    _, small = measure_peak(lambda: torch.ones(1024).sum())
    assert small < 8 * 2**20


def test_bench_attention_records_and_skips():
    from attnlab.bench.attention import GiB, bench_attention

    records = list(bench_attention(lengths=(32, 64), names=("math", "chunked", "linear"), heads=2, head_dim=8,
                                   repeats=1, memory_budget=40_000))  # 2 x the scores: 16 kB at T=32, 64 kB at 64
    assert [(r["backend"], r["seq_len"], r["pass"]) for r in records] == [
        (b, T, p) for T in (32, 64) for b in ("math", "chunked", "linear") for p in ("forward", "forward_backward")]
    for r in records:
        assert r["scores_bytes"] == 1 * 2 * r["seq_len"] ** 2 * 4
        if r["backend"] == "math" and r["seq_len"] == 64:
            assert "scores alone need" in r["skipped"] and "budget" in r["skipped"]
        else:
            assert r["seconds"] > 0 and r["peak_bytes"] >= 0 and "skipped" not in r
    slow = list(bench_attention(lengths=(16, 4096), names=("chunked",), heads=1, head_dim=4, repeats=1,
                                memory_budget=GiB, time_limit=1e-9))
    assert "would take about" in slow[-1]["skipped"]


def test_cli_bench_attention_json_and_plot(tmp_path):
    plot = tmp_path / "attention.png"
    done = subprocess.run([*ATTNLAB, "bench", "attention", "--lengths", "16", "32", "--backends", "math", "local",
                           "--heads", "2", "--head-dim", "8", "--repeats", "1", "--json", "--plot", str(plot)],
                          capture_output=True, text=True)  # a process of its own: its peak memory is the bench's
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(records) == 2 * 2 * 2
    assert all({"backend", "seq_len", "pass", "seconds", "peak_bytes"} <= set(r) for r in records)
    import matplotlib.image

    image = matplotlib.image.imread(plot)
    assert image.shape[0] > 300 and image.shape[1] > 600
    refused = run_cli("bench", "attention", "--backends", "flash")
    assert refused.returncode == 2 and "unknown backend 'flash'" in refused.stderr


def test_bench_train_records_ratios_mfu_and_the_interleaved_gemm_peak():
    from attnlab.bench.train import bench_train

    records = list(bench_train(precisions=("fp32",), repeats=1, with_hf=False))
    by_name = {r["name"]: r for r in records}
    peak, train, mfu = by_name["gemm_peak_fp32"], by_name["train_fp32"], by_name["train_fp32_mfu"]
    assert peak["unit"] == "GFLOP/s" and 1 < peak["value"] < 1e5
    assert train["reference"] == "torch.nn.Transformer" and train["unit"] == "tokens/s"
    assert train["ratio"] == pytest.approx(train["value"] / train["reference_value"], rel=1e-3)
    assert mfu["tokens_per_step"] == 1536 and mfu["flops_per_step"] > 6e10  # 70.6 GFLOP of products a step
    seconds = 1536 / train["value"]
    assert mfu["value"] == pytest.approx(mfu["flops_per_step"] / seconds / (peak["value"] * 1e9), rel=0.01)


def test_bench_decode_records():
    from attnlab.bench.decode import bench_decode

    decode = {r["name"]: r for r in bench_decode(batch=2, new_tokens=5, src_len=6, beam=2, repeats=1, with_hf=False)}
    assert {"decode_greedy", "decode_beam5", "decode_greedy_nocache", "decode_cache_speedup"} <= decode.keys()
    assert all(decode[n]["unit"] == "tokens/s" and decode[n]["value"] > 0 for n in ("decode_greedy", "decode_beam5"))
    speedup = decode["decode_cache_speedup"]["value"]
    assert speedup == pytest.approx(decode["decode_greedy"]["value"] / decode["decode_greedy_nocache"]["value"], rel=0.02)


def half_a_second(fns, repeats, **kwargs):
    """interleaved_medians with every median at 0.5 s, each function run once."""
    for fn in fns.values():
        fn()
    return {name: 0.5 for name in fns}


def test_bench_lm_turns_its_timings_into_tokens_per_second(monkeypatch):
    """Each timed function runs; with every median at 0.5 s, the figures are tokens / 0.5."""
    import attnlab.bench.lm as lm_bench

    monkeypatch.setattr(lm_bench, "interleaved_medians", half_a_second)
    lm = {r["name"]: r for r in lm_bench.bench_lm(repeats=1)}
    assert {name: (r["value"], r["unit"]) for name, r in lm.items()} == {
        "lm_train": (12 * 64 / 0.5, "tokens/s"), "lm_sample_b1": (1 * 63 / 0.5, "tokens/s"),
        "lm_sample_b32": (32 * 63 / 0.5, "tokens/s")}


def test_bench_encoder_times_one_set_of_weights_in_both_implementations(monkeypatch):
    """With every median at 0.5 s, tokens/s is tokens / 0.5 and the ratio 1; the outputs agree."""
    import attnlab.bench.encoder as encoder_bench

    monkeypatch.setattr(encoder_bench, "interleaved_medians", half_a_second)
    records = list(encoder_bench.bench_encoder(batch=2, seq_len=16, precisions=("fp32",), backends=("math", "sdpa"),
                                               repeats=1))
    assert [r["name"] for r in records] == ["encoder_fp32_math", "encoder_fp32_sdpa"]
    for r in records:
        assert (r["value"], r["reference_value"], r["ratio"]) == (64.0, 64.0, 1.0)
        assert r["reference"] == "transformers.BertModel" and r["max_abs_difference"] < 1e-5
    done = run_cli("bench", "encoder", "--seq-len", "513")
    assert done.returncode == 2 and "--seq-len between 1 and 512" in done.stderr
