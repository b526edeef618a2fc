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

from helpers import ATTNLAB, fixed_medians, run_cli

ROOT = Path(__file__).resolve().parents[1]
PRESETS = {"transformer": "multi30k_de_en", "gru_bahdanau": "rnn_bahdanau", "gru_fixed_context": "rnn_fixed_context"}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_benchmarked_models_are_the_presets(name):
    preset = yaml.safe_load((ROOT / "configs" / f"{PRESETS[name]}.yaml").read_text())
    assert MODELS[name] == preset["model"]
    assert preset["data"]["text"]["vocab_size"] == 8000


def test_records_carry_the_transformer_as_reference(monkeypatch):
    """Each record's ratio is the Transformer's seconds over the model's, from the unrounded
    medians: with the fixed-context GRU's 1.6 s, decoding 6 tokens at T=3 is 3.75 tokens/s, shown
    as 3.8, against the Transformer's 15.0; the ratio is 0.25, not 3.8 / 15.0."""
    import attnlab.bench.models as models_bench

    seconds = {"transformer": 0.4, "gru_bahdanau": 0.3, "gru_fixed_context": 1.6}  # no figure on a rounding tie
    monkeypatch.setattr(models_bench, "interleaved_medians", fixed_medians(seconds))
    records = list(bench_models(lengths=(3, 5), batch_tokens=12, decode_batch=2, repeats=1))
    assert [(r["name"], r["model"], r["seq_len"]) for r in records] == [
        (kind, model, T) for T in (3, 5) for model in MODELS for kind in ("train", "decode")
    ]
    for r in records:
        assert r["unit"] == "tokens/s" and r["precision"] == "fp32"
        assert r["batch"] == (12 // r["seq_len"] if r["name"] == "train" else 2)
        tokens = r["batch"] * (r["seq_len"] + 1 if r["name"] == "train" else r["seq_len"])  # targets + EOS in training
        assert r["value"] == round(tokens / seconds[r["model"]], 1)
        if r["model"] == REFERENCE:
            assert "ratio" not in r and "reference" not in r
        else:
            assert r["reference"] == REFERENCE and r["ratio"] == round(seconds[REFERENCE] / seconds[r["model"]], 3)
    fixed = {(r["name"], r["seq_len"]): r for r in records if r["model"] == "gru_fixed_context"}
    assert (fixed["decode", 3]["value"], fixed["decode", 3]["ratio"]) == (3.8, 0.25)


def test_cli_bench_models_json_and_bad_arguments():
    done = run_cli(
        "bench",
        "models",
        "--lengths",
        "4",
        "--models",
        "transformer",
        "gru_bahdanau",
        "--batch-tokens",
        "8",
        "--decode-batch",
        "1",
        "--repeats",
        "1",
        "--precision",
        "bf16",
        "--json",
        "--device",
        "cpu",
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert {(r["name"], r["model"]) for r in records} == {
        (k, m) for k in ("train", "decode") for m in ("transformer", "gru_bahdanau")
    }
    assert all(r["precision"] == "bf16" and r["device"] == "cpu" for r in records)
    for bad, says in ((["--models", "lstm"], "unknown model 'lstm'"), (["--lengths", "0"], "at least 1")):
        refused = run_cli("bench", "models", *bad)
        assert refused.returncode == 2 and says in refused.stderr and "Traceback" not in refused.stderr


def test_peak_memory_counts_what_a_pass_allocates():
    from attnlab.bench.attention import measure_peak

    _, peak = measure_peak(lambda: torch.ones(16 * 2**20))  # 64 MiB of float32, returned (alive at the end)
    assert 64 * 2**20 <= peak < 72 * 2**20
    _, small = measure_peak(lambda: torch.ones(1024).sum())
    assert small < 8 * 2**20


def test_bench_attention_records_and_skips(monkeypatch):
    """Each pass is timed at a set 0.5 s (the real pass runs): the records carry it, and the time limit
    skips a length by extrapolating from the last one that ran, whatever the machine's speed."""
    import attnlab.bench.attention as attention_bench
    from attnlab.bench.attention import GiB, bench_attention

    monkeypatch.setattr(attention_bench, "timed", lambda fn, device: (0.5, fn()))
    records = list(
        bench_attention(
            lengths=(32, 64), names=("math", "chunked", "linear"), heads=2, head_dim=8, repeats=1, memory_budget=40_000
        )
    )  # 2 x the scores: 16 kB at T=32, 64 kB at 64
    assert [(r["backend"], r["seq_len"], r["pass"]) for r in records] == [
        (b, T, p) for T in (32, 64) for b in ("math", "chunked", "linear") for p in ("forward", "forward_backward")
    ]
    for r in records:
        assert r["scores_bytes"] == 1 * 2 * r["seq_len"] ** 2 * 4
        if r["backend"] == "math" and r["seq_len"] == 64:
            assert "scores alone need" in r["skipped"] and "budget" in r["skipped"]
        else:
            assert r["seconds"] == 0.5 and r["peak_bytes"] >= 0 and "skipped" not in r
    # chunked grows as T^2: 0.5 s at T=16 -> 8 s at T=64 (under the 60 s limit) -> 2048 s at T=4096 (skipped)
    slow = list(
        bench_attention(
            lengths=(16, 64, 4096), names=("chunked",), heads=1, head_dim=4, repeats=1, memory_budget=GiB, time_limit=60
        )
    )
    assert [r.get("skipped") for r in slow] == [None] * 4 + [
        "would take about 2048 s (from 0.5 s at T=64), over the 60 s limit"
    ] * 2


def test_cli_bench_attention_json_and_plot(tmp_path):
    plot = tmp_path / "attention.png"
    done = subprocess.run(
        [
            *ATTNLAB,
            "bench",
            "attention",
            "--lengths",
            "16",
            "32",
            "--backends",
            "math",
            "local",
            "--heads",
            "2",
            "--head-dim",
            "8",
            "--repeats",
            "1",
            "--json",
            "--plot",
            str(plot),
        ],
        capture_output=True,
        text=True,
    )  # a process of its own: its peak memory is the bench's
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(records) == 2 * 2 * 2
    assert all({"backend", "seq_len", "pass", "seconds", "peak_bytes"} <= set(r) for r in records)
    assert all(r["device"] == "cpu" and r["peak_memory"] == "process resident set (VmHWM)" for r in records)
    import matplotlib.image

    image = matplotlib.image.imread(plot)
    assert image.shape[0] > 300 and image.shape[1] > 600
    refused = run_cli("bench", "attention", "--backends", "flash")
    assert refused.returncode == 2 and "unknown backend 'flash'" in refused.stderr


def test_bench_train_records_ratios_mfu_and_the_interleaved_gemm_peak(monkeypatch):
    """With set medians (attnlab 0.5 s a step, torch.nn.Transformer 0.75 s, the 4 GEMMs 0.05 s), every
    figure is exact: tokens/s, the ratio, the GEMM peak and both MFUs, each from the unrounded medians."""
    import attnlab.bench.train as train_bench

    seconds = {"attnlab": 0.5, "torch.nn.Transformer": 0.75, "gemm": 0.05}
    monkeypatch.setattr(train_bench, "interleaved_medians", fixed_medians(seconds))
    records = list(train_bench.bench_train(precisions=("fp32",), repeats=1, with_hf=False))
    by_name = {r["name"]: r for r in records}
    peak, train, mfu = by_name["gemm_peak_fp32"], by_name["train_fp32"], by_name["train_fp32_mfu"]
    peak_flops = 4 * 2 * 1024**3 / 0.05  # 4 products of 1024 x 1024 x 1024 in 0.05 s
    assert peak["unit"] == "GFLOP/s" and peak["value"] == round(peak_flops / 1e9, 1) == 171.8
    assert train["reference"] == "torch.nn.Transformer" and train["unit"] == "tokens/s"
    assert (train["value"], train["reference_value"], train["ratio"]) == (1536 / 0.5, 1536 / 0.75, 1.5)
    assert mfu["tokens_per_step"] == 1536 and mfu["flops_per_step"] > 6e10  # 70.6 GFLOP of products a step
    flops = mfu["flops_per_step"]
    assert mfu["value"] == train["mfu"] == round(flops / 0.5 / peak_flops, 4)
    assert train["reference_mfu"] == round(flops / 0.75 / peak_flops, 4)
    assert mfu["achieved_gflops"] == round(flops / 0.5 / 1e9, 1) and mfu["peak_gflops"] == peak["value"]
    assert all(r["device"] == "cpu" and r["device_name"] for r in records) and peak["gemm_size"] == 1024


# -- bench train --shape: real sizes against the references users compare with ------------------------------

SHAPE_PARAMETERS = {  # attnlab's, and what its reference has fewer (or more)
    "gpt2-small": (124_475_904, 36_096),  # GPT-2's 124,439,808, and 47 rows padding V to 50,304
    "transformer-base": (60_522_496, -2_048),  # nn.Transformer adds a final LayerNorm to each post-norm stack
    "bert-base": (110_111_036, 596_738),  # also attnlab's pooler and 2-class classifier, and 6 padding rows
}


@pytest.mark.parametrize("name", sorted(SHAPE_PARAMETERS))
def test_each_shape_is_its_references_size_and_trains_at_a_tiny_batch(name, monkeypatch):
    """Every shape builds at full size on the CPU, as many parameters as its reference (but for the
    parts named), and gives sound records for a step of 2 sequences of 8 tokens."""
    import attnlab.bench.shapes as shapes
    from attnlab.bench.shapes import SHAPES, bench_shape

    shape = SHAPES[name]
    count = lambda model: sum(p.numel() for p in model.parameters())
    ours, difference = SHAPE_PARAMETERS[name]
    assert count(shape.attnlab_model()) == ours and ours - count(shape.reference()) == difference
    # set medians (the steps run): at a few tokens/s, a ratio of the 0.1-rounded figures would be off by per cents
    seconds = {"attnlab": 5.0, shape.reference_name: 6.0, "gemm": 0.05}
    monkeypatch.setattr(shapes, "interleaved_medians", fixed_medians(seconds))
    records = {r["name"]: r for r in bench_shape(shape, batch=2, seq_len=8, precision="fp32", repeats=1)}
    peak, train, mfu = records["gemm_peak_fp32"], records[f"train_{name}"], records[f"train_{name}_mfu"]
    assert train["reference"] == shape.reference_name and train["unit"] == "tokens/s"
    assert (train["value"], train["reference_value"], train["ratio"]) == (3.2, 2.7, 1.2)  # 16 tokens / 5 s, / 6 s
    assert mfu["tokens_per_step"] == 16 and train["peak_memory_mib"] is None  # peak memory: CUDA only
    # 6 x parameters x tokens, give or take attention's products and the untouched classifier
    assert mfu["flops_per_step"] == pytest.approx(6 * ours * 16, rel=0.05)
    peak_flops = 4 * 2 * 1024**3 / 0.05
    assert peak["value"] == 171.8 and mfu["value"] == train["mfu"] == round(mfu["flops_per_step"] / 5.0 / peak_flops, 4)
    assert train["reference_mfu"] == round(mfu["flops_per_step"] / 6.0 / peak_flops, 4)
    assert mfu["published_bf16_peak_gflops"] is None and mfu["mfu_of_published_bf16_peak"] is None  # a CPU
    assert all(
        r["shape"] == name
        and r["batch"] == 2
        and r["seq_len"] == 8
        and r["device"] == "cpu"
        and r["steps_per_sample"] == 1
        for r in records.values()
    )  # a CPU does not queue ahead


def test_bench_train_shape_on_the_command_line():
    done = run_cli(
        "bench",
        "train",
        "--shape",
        "transformer-base",
        "--batch",
        "2",
        "--seq-len",
        "4",
        "--precision",
        "fp32",
        "--repeats",
        "1",
        "--no-hf",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["name"] for r in records] == ["gemm_peak_fp32", "train_transformer-base", "train_transformer-base_mfu"]
    assert records[1]["reference"] == "torch.nn.Transformer" and isinstance(records[1]["ratio"], float)  # not HF
    for args, message in [
        (["--shape", "gpt3"], "--shape 'gpt3' is not one of gpt2-small, transformer-base, bert-base"),
        (["--batch", "2"], "--batch, --seq-len and --compile size a named shape: give --shape too"),
        (
            ["--shape", "bert-base", "--seq-len", "513"],
            "--seq-len must be between 2 and bert-base's 512 positions (got 513)",
        ),
        (["--shape", "gpt2-small", "--batch", "0"], "--batch must be at least 1 (got 0)"),
        (
            ["--shape", "gpt2-small", "--compile", "graphs", "--device", "cpu"],
            "--compile graphs replays CUDA graphs: it needs a GPU (the bench is on cpu)",
        ),
    ]:
        refused = run_cli("bench", "train", *args)
        assert refused.returncode == 2 and refused.stderr == f"error: {message}\n"


def test_published_peaks_by_device_name(monkeypatch):
    import attnlab.bench.device as device

    for name, peak in [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA GeForce RTX 4090", None),
    ]:
        monkeypatch.setattr(device, "device_name", lambda _, name=name: name)
        assert device.published_bf16_peak(torch.device("cuda", 0)) == peak
    assert device.published_bf16_peak(torch.device("cpu")) is None


def test_bench_decode_records(monkeypatch):
    """With set medians, tokens/s and the cache's speed-up are exact, each from the unrounded medians
    (the speed-up is not the ratio of the 0.1-rounded tokens/s)."""
    import attnlab.bench.decode as decode_bench

    seconds = {"decode_greedy": 0.3, "decode_greedy_nocache": 2.2}
    monkeypatch.setattr(decode_bench, "interleaved_medians", fixed_medians(seconds, default=0.5))
    decode = {
        r["name"]: r
        for r in decode_bench.bench_decode(
            batch=2, new_tokens=5, src_len=6, beam=2, repeats=1, with_hf=False, weights=("int8", "bf16"), with_ct2=False
        )
    }
    searches = [
        "decode_greedy",
        "decode_beam2",
        "decode_greedy_int8",
        "decode_beam2_int8",
        "decode_greedy_bf16",
        "decode_beam2_bf16",
    ]
    assert {*searches, "decode_greedy_nocache", "decode_cache_speedup"} == decode.keys()
    assert all(
        decode[n]["unit"] == "tokens/s" and decode[n]["value"] == round(10 / seconds.get(n, 0.5), 1)
        for n in [*searches, "decode_greedy_nocache"]
    )
    assert (decode["decode_greedy"]["value"], decode["decode_greedy_nocache"]["value"]) == (33.3, 4.5)
    assert decode["decode_cache_speedup"]["value"] == 7.33  # 2.2 / 0.3; 33.3 / 4.5 would be 7.4


def test_bench_decode_compares_each_weights_variant_with_hf_fp32(monkeypatch):
    """With faked medians (Hugging Face 1 s, ours 0.5 s in fp32, 0.25 s in int8), each search with
    int8 weights is a ratio against Hugging Face's fp32 search of the same kind."""
    import attnlab.bench.decode as decode_bench

    def medians(fns, repeats, **kwargs):
        for fn in fns.values():  # each runs: the int8 searches are real
            fn()
        return {name: 1.0 if name.startswith("hf_") else 0.25 if name.endswith("_int8") else 0.5 for name in fns}

    monkeypatch.setattr(decode_bench, "interleaved_medians", medians)
    decode = {
        r["name"]: r
        for r in decode_bench.bench_decode(batch=2, new_tokens=3, src_len=5, beam=2, repeats=1, weights=("int8",))
    }
    for search in ("greedy", "beam2"):
        assert decode[f"decode_{search}"]["ratio"] == 2.0 and decode[f"decode_{search}_int8"]["ratio"] == 4.0
        assert decode[f"decode_{search}_int8"]["reference"] == "transformers.MarianMTModel"
        assert decode[f"decode_{search}_int8"]["value"] == 2 * 3 / 0.25
    assert decode["decode_greedy_nocache"]["reference"] == "transformers.MarianMTModel (use_cache=False)"


def lm_run(tmp_path: Path, name: str, letters: str = "abcdefgh", **model) -> Path:
    """A character LM trained for 40 steps on repeated ``letters``, with ``model`` fields."""
    text = tmp_path / f"{name}.txt"
    text.write_text(letters * 50)
    fields = {
        "arch": "decoder_lm",
        "stack": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "dropout": 0.0},
        "positions": {"scheme": "learned", "max_len": 24},
    } | model
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": fields,
                "data": {"format": "text", "train": str(text), "text": {"tokenizer": "char"}, "block_size": 16},
                "train": {
                    "max_steps": 40,
                    "batch_size": 8,
                    "lr_schedule": "constant",
                    "lr": 0.01,
                    "warmup_steps": 5,
                    "eval_every": 40,
                    "progress": False,
                },
            }
        )
    )
    done = run_cli("train", str(config), "--out", str(tmp_path / name))
    assert done.returncode == 0, done.stderr
    return tmp_path / name


def test_bench_lm_run_times_each_way_to_decode_a_trained_run(tmp_path, monkeypatch):
    """A run with 2 multi-token heads, decoded greedily at batch 1 from 'ab' to its 24 positions:
    plain (the reference), int8 weights, the compiled step, speculative with the run itself as draft (every
    proposal accepted) and with its own heads; with every median at 0.5 s, the figures are
    22 / 0.5 tokens/s and the ratios 1. More proposals than heads, and a draft with another
    vocabulary, are refused."""
    import attnlab.bench.lm as lm_bench
    from attnlab.errors import UsageError

    run = lm_run(tmp_path, "lm", multi_token_heads=2)
    monkeypatch.setattr(lm_bench, "interleaved_medians", half_a_second)
    records = {
        r["name"]: r
        for r in lm_bench.bench_lm_run(run, (str(run), "heads"), ("int8",), k=2, prompt="ab", compiled=True)
    }
    assert list(records) == [
        "lm_greedy",
        "lm_greedy_int8",
        "lm_greedy_compiled",
        "lm_speculative_lm",
        "lm_speculative_heads",
    ]
    for r in records.values():
        assert (r["value"], r["batch"], r["new_tokens"]) == (22 / 0.5, 1, 22)
        assert r.get("ratio", 1.0) == 1.0
    assert records["lm_speculative_lm"]["acceptance_rate"] == 1.0  # the run drafts for itself
    assert records["lm_speculative_lm"]["tokens_per_pass"] == pytest.approx(22 / 8)  # ceil(22 / 3) passes
    assert 0 <= records["lm_speculative_heads"]["acceptance_rate"] <= 1
    with pytest.raises(UsageError, match="2 multi-token heads, and k \\(3\\)"):
        next(lm_bench.bench_lm_run(run, ("heads",), k=3))
    other = lm_run(tmp_path, "other", letters="abcdefgz")
    with pytest.raises(UsageError, match="has another tgt vocabulary than the model; a draft must share"):
        next(lm_bench.bench_lm_run(run, (str(other),)))
    done = run_cli("bench", "lm", "--draft", "heads")
    assert done.returncode == 2 and done.stderr == (
        "error: --draft, --weights and --compiled measure a trained run: give --run RUN\n"
    )


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
        "lm_train": (12 * 64 / 0.5, "tokens/s"),
        "lm_sample_b1": (1 * 63 / 0.5, "tokens/s"),
        "lm_sample_b32": (32 * 63 / 0.5, "tokens/s"),
    }


def test_bench_encoder_times_one_set_of_weights_in_both_implementations(monkeypatch):
    """With every median at 0.5 s, tokens/s is tokens / 0.5 and the ratio 1; the outputs agree."""
    import attnlab.bench.encoder as encoder_bench

    monkeypatch.setattr(encoder_bench, "interleaved_medians", half_a_second)
    records = list(
        encoder_bench.bench_encoder(
            batch=2, seq_len=16, precisions=("fp32",), backends=("math", "sdpa"), repeats=1, with_ort=False
        )
    )
    assert [r["name"] for r in records] == ["encoder_fp32_math", "encoder_fp32_sdpa"]
    for r in records:
        assert (r["value"], r["reference_value"], r["ratio"]) == (64.0, 64.0, 1.0)
        assert r["reference"] == "transformers.BertModel" and r["max_abs_difference"] < 1e-5
    done = run_cli("bench", "encoder", "--seq-len", "513")
    assert done.returncode == 2 and "--seq-len between 1 and 512" in done.stderr


def test_bench_audio_times_each_tokenisation_against_its_twin_with_precomputed_front_ends(monkeypatch):
    """With every median at 0.5 s, each record is 32 s of audio / 0.5 s with ratio 1; the twin (front ends
    replayed) gives the original's logits on the batch, its LogMel and Decimation modules replaced and
    nothing else; the log-mels equal WhisperFeatureExtractor's within 1e-4."""
    import attnlab.bench.audio as audio_bench
    from attnlab.models import build_model, model_config

    monkeypatch.setattr(audio_bench, "interleaved_medians", half_a_second)
    records = list(audio_bench.bench_audio(repeats=1))
    assert [r["name"] for r in records] == [
        "audio_train_frames",
        "audio_train_patches",
        "audio_train_waveform",
        "audio_train_convolutions",
        "audio_features_log_mel",
    ]
    assert all((r["value"], r["reference_value"], r["ratio"]) == (64.0, 64.0, 1.0) for r in records)
    assert (
        records[-1]["reference"] == "transformers.WhisperFeatureExtractor" and records[-1]["max_abs_difference"] < 1e-4
    )
    waveforms, lengths, _ = audio_bench.batch(0, torch.device("cpu"))
    shape = audio_bench.DataShape(sample_rate=8000, samples=8000, n_classes=10)
    for name, section in audio_bench.MODELS.items():
        model = build_model(model_config(section), shape).eval()
        twin = audio_bench.precomputed(model, waveforms, lengths).eval()
        replaced = [n for n, m in twin.named_modules() if isinstance(m, audio_bench.Precomputed)]
        assert replaced == (
            ["tokens.decimations.0", "tokens.decimations.1"] if name == "waveform" else ["spectrogram.log_mel"]
        )
        with torch.no_grad():
            assert torch.equal(twin.classify(waveforms, lengths), model.classify(waveforms, lengths)), name


def test_bench_gpt2_generates_the_same_tokens_as_transformers_on_the_same_weights():
    """The timed greedy generations are compared too: the imported GPT-2's tokens are transformers'."""
    from attnlab.bench.generate import bench_generate

    records = list(bench_generate("tiny", batches=(1, 2), prompt_len=4, new_tokens=6, repeats=1))
    assert [r["name"] for r in records] == ["gpt2_tiny_greedy_batch1", "gpt2_tiny_greedy_batch2"]
    for r in records:
        assert r["same_tokens"] and r["reference"] == "transformers.GPT2LMHeadModel.generate"
        assert r["ratio"] == pytest.approx(r["value"] / r["reference_value"], rel=1e-2)
    done = run_cli("bench", "gpt2", "--prompt-len", "1000", "--new-tokens", "100")
    assert done.returncode == 2 and "within GPT-2's 1,024 positions" in done.stderr


# -- devices: --device on every suite, synchronised timings, MFU, records that name the device -----------------

SUITES = {
    "train": ("train", "bench_train"),
    "decode": ("decode", "bench_decode"),
    "lm": ("lm", "bench_lm"),
    "encoder": ("encoder", "bench_encoder"),
    "gpt2": ("generate", "bench_generate"),
    "models": ("models", "bench_models"),
    "attention": ("attention", "bench_attention"),
    "audio": ("audio", "bench_audio"),
}
CUDA = torch.device("cuda", 1)


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_every_suite_runs_on_the_resolved_device(suite, monkeypatch):
    """--device cpu and auto (no GPU here) reach the bench as torch.device('cpu'), named on stderr;
    cuda is refused in one line naming --device, with the ConfigError's exit code."""
    import importlib

    module, function = SUITES[suite]
    seen = []
    monkeypatch.setattr(
        importlib.import_module(f"attnlab.bench.{module}"),
        function,
        lambda *args, device, **kwargs: seen.append(device) or iter(()),
    )
    for name in ("cpu", "auto"):
        done = run_cli("bench", suite, "--device", name)
        assert done.returncode == 0, done.stderr
        assert done.stderr.splitlines()[1].startswith("device: cpu (")  # after the header of what is measured
    assert seen == [torch.device("cpu")] * 2
    refused = run_cli("bench", suite, "--device", "cuda")
    assert refused.returncode == 3 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("error: --device is 'cuda' but no CUDA device is available")
    assert seen == [torch.device("cpu")] * 2  # refused before the bench started


def fake_cuda(monkeypatch, events: list) -> None:
    """torch.cuda's synchronize logged in ``events`` (no GPU needed)."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(("sync", device)))


def test_timed_waits_for_cuda_before_and_after_the_call_and_never_on_the_cpu(monkeypatch):
    from attnlab.bench.timing import timed

    events = []
    fake_cuda(monkeypatch, events)
    assert timed(lambda: events.append("call") or 7, CUDA)[1] == 7
    assert events == [("sync", CUDA), "call", ("sync", CUDA)]
    events.clear()
    timed(lambda: events.append("call"), torch.device("cpu"))
    assert events == ["call"]


def test_interleaved_medians_are_synchronised_medians(monkeypatch):
    """On a clock that the calls move by known amounts, the medians are those amounts; each timed call
    is synchronised on both sides, the warm-up calls are not timed."""
    import attnlab.bench.timing as timing

    now, events = [0.0], []
    fake_cuda(monkeypatch, events)
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    durations = {"a": iter([9.0, 1.0, 2.0, 3.0]), "b": iter([9.0, 5.0, 4.0, 30.0])}  # a warm-up, then 3 timed

    def step(name):
        def call():
            now[0] += next(durations[name])

        return call

    medians = timing.interleaved_medians({"a": step("a"), "b": step("b")}, repeats=3, warmup=1, device=CUDA)
    assert medians == {"a": 2.0, "b": 5.0}
    assert events == [("sync", CUDA)] * (3 * 2 * 2)


def test_a_sample_of_several_calls_times_them_in_a_row_between_two_synchronisations(monkeypatch):
    """calls=3: each timed sample is three calls with no synchronisation between them, and its
    seconds are divided by three."""
    import attnlab.bench.timing as timing

    now, events = [0.0], []
    fake_cuda(monkeypatch, events)
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    durations = iter([1.0, 2.0, 6.0, 1.0, 1.0, 1.0, 9.0, 9.0, 9.0])  # samples of 9, 3 and 27 s

    def call():
        events.append("call")
        now[0] += next(durations)

    assert timing.interleaved_medians({"a": call}, repeats=3, warmup=0, device=CUDA, calls=3) == {"a": 3.0}
    assert events == [("sync", CUDA), "call", "call", "call", ("sync", CUDA)] * 3


def test_a_training_steps_state_is_its_weights_buffers_and_moments_each_storage_once():
    """After one step, a step's state is its model's weights and buffers (the tied table once) and
    Adam's two moments and step count per weight, counted here from the tensors themselves."""
    from attnlab.bench.reference import attnlab_model
    from attnlab.bench.train import attnlab_step, random_batch, train_config

    model = attnlab_model()
    step = attnlab_step(model, random_batch(), train_config("fp32"))
    weights = {p.data_ptr(): p.nbytes for p in model.parameters()}
    assert len(weights) < len(list(model.named_parameters(remove_duplicate=False)))  # a tied table
    step()
    moments = sum(t.nbytes for state in step.optimizer.state.values() for t in state.values())
    assert moments >= 2 * sum(weights.values())  # exp_avg, exp_avg_sq (and a step count) per weight
    buffers = sum(b.nbytes for b in model.buffers())
    assert step.state_bytes() == sum(weights.values()) + buffers + moments


def test_a_shapes_peak_memory_is_its_own_state_and_its_steps_allocations(monkeypatch):
    """On CUDA (faked) the peak of a side is what its step allocates above the memory allocated
    before it (which holds the other side's and the GEMM's too), plus the side's own state."""
    from attnlab.bench.shapes import peak_memory

    events = []
    fake_cuda(monkeypatch, events)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: events.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 50 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 80 * 2**20)

    class Step:
        def __call__(self):
            events.append("step")

        def state_bytes(self):
            return 12 * 2**20

    assert peak_memory(Step(), CUDA) == 30 + 12
    assert events == [("sync", CUDA), "reset", ("sync", CUDA), "step", ("sync", CUDA)]
    assert peak_memory(Step(), torch.device("cpu")) is None


def test_peak_memory_on_cuda_is_the_allocators_peak_above_the_baseline(monkeypatch):
    from attnlab.bench.attention import measure_peak

    events = []
    fake_cuda(monkeypatch, events)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: events.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 100)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 1100)
    seconds, peak = measure_peak(lambda: events.append("call"), CUDA)
    assert peak == 1000 and seconds >= 0
    assert events == [("sync", CUDA), ("reset", CUDA), ("sync", CUDA), "call", ("sync", CUDA)]


def test_mfu_and_the_gemm_flops():
    from attnlab.bench.train import GEMM_SIZE, gemm, mfu

    assert mfu(flops=6e10, seconds=2.0, peak=1e11) == pytest.approx(0.3)  # 3e10 FLOP/s of 1e11
    call, flops = gemm("fp32", torch.device("cpu"), products=3)
    assert GEMM_SIZE == {"cpu": 1024, "cuda": 8192} and flops == 3 * 2 * 1024**3
    call()


def test_train_lines_show_both_mfus_as_percentages(capsys):
    from attnlab.cli.bench_runners import emit_comparison

    train = {
        "name": "train_fp32",
        "value": 3048.8,
        "unit": "tokens/s",
        "reference": "torch.nn.Transformer",
        "reference_value": 2856.8,
        "ratio": 1.067,
        "mfu": 0.779,
        "reference_mfu": 0.71,
    }
    mfu = {
        "name": "train_fp32_mfu",
        "value": 0.779,
        "unit": "fraction of the fp32 GEMM peak",
        "achieved_gflops": 148.2,
        "peak_gflops": 190.3,
    }
    for record in (train, mfu, mfu | {"value": 1.364}):
        emit_comparison(record, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("torch.nn.Transformer: 2,856.8   ratio x1.07   MFU 77.9% vs 71.0%")
    assert lines[1].split()[1:] == ["77.9%", "of", "the", "GEMM", "peak", "148.2", "of", "190.3", "GFLOP/s"]
    assert "136.4% of the GEMM peak" in lines[2] and "did not reach its peak" in lines[2]


def test_records_name_the_device(tmp_path, monkeypatch):
    from attnlab.bench.device import cpu_model, device_fields

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Fake CPU 9000 @ 3.0GHz\nflags\t\t: fpu\n")
    assert cpu_model(cpuinfo) == "Fake CPU 9000 @ 3.0GHz"
    assert device_fields(torch.device("cpu")) == {"device": "cpu", "device_name": cpu_model()}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"Fake GPU {device.index}")
    assert device_fields(CUDA) == {"device": "cuda:1", "device_name": "Fake GPU 1"}


@pytest.mark.cuda
def test_benches_run_on_cuda():
    """A tiny run of the training, models, attention and decoding benches on the GPU: records on cuda:0
    named after the GPU, MFU a fraction of the GEMM peak, peak memory from the CUDA allocator, the
    CUDA graph's gain in greedy decoding."""
    from attnlab.bench.attention import bench_attention
    from attnlab.bench.train import bench_train

    cuda = torch.device("cuda", 0)
    where = {"device": "cuda:0", "device_name": torch.cuda.get_device_name(0)}
    train = {r["name"]: r for r in bench_train(("bf16",), repeats=1, with_hf=False, device=cuda)}
    assert all(r.items() >= where.items() for r in train.values())
    # the figures themselves are timings: their fields are checked, never their sizes (no GPU's load fails this)
    assert train["gemm_peak_bf16"]["gemm_size"] == 8192 and train["train_bf16_mfu"]["value"] >= 0
    models = list(
        bench_models(
            lengths=(3,),
            models=("transformer",),
            batch_tokens=12,
            decode_batch=2,
            repeats=1,
            precision="bf16",
            device=cuda,
        )
    )
    assert len(models) == 2 and all(r["value"] >= 0 and r.items() >= where.items() for r in models)
    attention = list(bench_attention(lengths=(64,), names=("math",), heads=2, head_dim=8, repeats=1, device=cuda))
    math_forward = attention[0]
    assert math_forward["peak_memory"].startswith("CUDA") and math_forward.items() >= where.items()
    assert math_forward["peak_bytes"] >= 2 * 64 * 64 * 4  # at least the (B, H, T, T) float32 scores
    from attnlab.bench.decode import bench_decode

    decode = {r["name"]: r for r in bench_decode(batch=2, new_tokens=4, repeats=1, with_hf=False, device=cuda)}
    assert decode["decode_graph_speedup"]["value"] >= 0  # greedy with the CUDA graph, against the growable cache


# -- CTranslate2: the deployed engine's columns, on the same weights ----------------------------------------------

CT2_MISSING = "ctranslate2 is not installed (pip install 'attnlab[ct2]')"


def test_bench_decode_times_ctranslate2_at_each_compute_type_on_the_same_sources(monkeypatch):
    """With set medians (attnlab 0.5 s, CTranslate2 0.25 s), each attnlab search has a record against
    CTranslate2's at the same compute type (ratio 0.5) naming the threads both ran on; the
    CTranslate2 runs are real and give each row exactly as many tokens as attnlab's."""
    import attnlab.bench.decode as decode_bench

    seconds = {f"ct2_{search}{w}": 0.25 for search in ("greedy", "beam2") for w in ("", "_int8")}
    monkeypatch.setattr(decode_bench, "interleaved_medians", fixed_medians(seconds, default=0.5))
    records = {
        r["name"]: r
        for r in decode_bench.bench_decode(
            batch=2, new_tokens=3, src_len=5, beam=2, repeats=1, with_hf=False, weights=("int8", "bf16")
        )
    }
    for search in ("greedy", "beam2"):
        for w, compute_type in (("", "fp32"), ("_int8", "int8")):
            r = records[f"decode_{search}{w}_vs_ct2"]
            assert r["reference"] == f"ctranslate2.Translator ({compute_type})"
            assert (r["value"], r["reference_value"], r["ratio"]) == (12.0, 24.0, 0.5)
            assert r["intra_threads"] == torch.get_num_threads()
        assert f"decode_{search}_bf16_vs_ct2" not in records  # CTranslate2 has no bf16 on this CPU: no column

    model, src = decode_bench.decode_inputs(batch=3, src_len=5, seed=0)
    translations = decode_bench.translations(decode_bench.marian(0.0).hf.eval(), src, 4, 2, ("fp32",))
    ours = decode_bench.greedy(model, src, max_len=4, min_len=4)
    for run in translations.values():
        assert [len(row) for row in run()] == [len(row) for row in ours] == [4] * 3


def test_ctranslate2_columns_say_when_the_extra_is_missing(monkeypatch, capsys):
    """Without ctranslate2 (its import fails), each CTranslate2 column of bench decode and bench lm
    says so in its line, as transformers' columns do, and so does a bench on a GPU; --no-ct2 leaves
    them out."""
    import sys

    import attnlab.bench.decode as decode_bench
    import attnlab.bench.lm as lm_bench
    from attnlab.cli import main

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` raises ImportError
    monkeypatch.setattr(decode_bench, "interleaved_medians", fixed_medians(default=0.5))
    assert main(["bench", "decode", "--new-tokens", "2", "--batch", "1", "--repeats", "1", "--no-hf"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "_vs_ct2" in line]
    compute_types = ["fp32", "fp32", "int8", "int8"]
    assert [line.split(" tokens/s")[1] for line in lines] == [
        f"   ctranslate2.Translator ({w}): skipped ({CT2_MISSING})" for w in compute_types
    ]
    monkeypatch.setattr(lm_bench, "interleaved_medians", half_a_second)
    lm = {r["name"]: r for r in lm_bench.bench_lm(repeats=1)}
    assert lm["lm_sample_b32"]["skipped_reference"] == CT2_MISSING
    assert "reference" not in next(iter(lm_bench.bench_lm(repeats=1, with_ct2=False)))  # lm_train: none
    assert "_vs_ct2" not in str(
        list(
            decode_bench.bench_decode(
                batch=1, new_tokens=2, src_len=3, beam=2, repeats=1, with_hf=False, with_ct2=False
            )
        )
    )
    from attnlab.bench.ct2 import unavailable

    assert unavailable(CUDA) == "timed on the CPU only; this bench runs on cuda:1"  # a GPU bench: no CPU engine in it


def test_bench_lm_samples_with_ctranslate2s_generator_as_many_tokens(monkeypatch):
    """Sampling at batch 1 and 32 is against CTranslate2's Generator on a GPT-2 of the LM's shape:
    with every median at 0.5 s the ratio is 1, and its rows have the 63 tokens attnlab's have."""
    import attnlab.bench.lm as lm_bench
    from attnlab.bench.ct2 import engines, numbered

    monkeypatch.setattr(lm_bench, "interleaved_medians", half_a_second)
    lm = {r["name"]: r for r in lm_bench.bench_lm(repeats=1)}
    for b in (1, 32):
        r = lm[f"lm_sample_b{b}"]
        assert (r["reference"], r["reference_value"], r["ratio"]) == ("ctranslate2.Generator (fp32)", b * 63 / 0.5, 1.0)
        assert r["intra_threads"] == torch.get_num_threads()
    vocabulary = numbered(lm_bench.VOCAB, bos=1, eos=2, unk=3)
    generator = engines("Generator", lm_bench.lm_gpt2(), vocabulary, ("fp32",))["fp32"]
    rows = lm_bench.generated(generator, vocabulary.names([[5], [9]]), 63)
    assert [len(row) for row in rows] == [63, 63] and rows[0] != rows[1]  # sampled, each row its own draw


def test_ctranslate2s_greedy_tokens_are_transformers_on_a_marian_model_in_marians_layout():
    """On a MarianMTModel laid out as Marian lays it (<pad> the last row, zero, and the decoder's
    start; CTranslate2's Marian loader assumes it), CTranslate2's fp32 greedy search gives
    transformers' tokens, row by row: the converter took the weights as they are."""
    import transformers

    from attnlab.bench.ct2 import engines, numbered
    from attnlab.bench.decode import translated

    v = 40
    config = transformers.MarianConfig(
        vocab_size=v,
        decoder_vocab_size=v,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        activation_function="relu",
        dropout=0.0,
        attention_dropout=0.0,
        max_position_embeddings=64,
        scale_embedding=True,
        pad_token_id=v - 1,
        eos_token_id=0,
        decoder_start_token_id=v - 1,
        forced_eos_token_id=None,
        init_std=0.5,
    )
    torch.manual_seed(0)
    hf = transformers.MarianMTModel(config).eval()
    vocabulary = numbered(v, eos=0, unk=1, pad=v - 1)
    src = torch.randint(2, v - 1, (4, 6), generator=torch.Generator().manual_seed(0))
    src = torch.cat([src, torch.zeros(4, 1, dtype=torch.long)], 1)  # (4, 7): + </s>
    theirs = hf.generate(input_ids=src, max_new_tokens=10, min_new_tokens=10, do_sample=False, num_beams=1)[:, 1:]
    translator = engines("Translator", hf, vocabulary, ("fp32",))["fp32"]
    ours = translated(translator, vocabulary.names(src.tolist()), 10, 1)
    assert [[vocabulary.tokens.index(t) for t in row] for row in ours] == theirs.tolist()
    assert len({tuple(row) for row in theirs.tolist()}) > 1  # the rows differ: the comparison can fail


def test_ctranslate2s_greedy_tokens_are_attnlabs_on_an_imported_gpt2():
    """CTranslate2's Generator on a GPT-2 converted by its converter, and attnlab's decoder_lm with the
    same weights (bench gpt2's pair): greedy, they write the same tokens."""
    from attnlab.bench.ct2 import Vocabulary, engines
    from attnlab.bench.generate import gpt2_pair
    from attnlab.decode.search import greedy as decode_greedy

    hf, ours, order = gpt2_pair("tiny")
    vocabulary = Vocabulary(
        [f"<{i}>" for i in range(50256)] + ["<|endoftext|>"],
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    generator = engines("Generator", hf, vocabulary, ("fp32",))["fp32"]
    prompts = torch.randint(0, 50256, (2, 4), generator=torch.Generator().manual_seed(0))  # GPT-2's ids
    to_ours = {old: new for new, old in enumerate(order) if old is not None}
    mine = decode_greedy(
        ours, prompt=torch.tensor([[to_ours[i] for i in row] for row in prompts.tolist()]), max_len=8, min_len=8
    )
    results = generator.generate_batch(
        vocabulary.names(prompts.tolist()), max_length=8, min_length=8, include_prompt_in_result=False
    )
    assert [r.sequences_ids[0] for r in results] == [[order[i] for i in row] for row in mine]


# -- ONNX Runtime: the deployed engine of exported encoders, on the same BertModel ---------------------------------

ORT_MISSING = "onnxruntime is not installed (pip install 'attnlab[ort]')"


def tiny_bert_config() -> dict:
    """The bench's BERT (all-MiniLM-L6-v2's config), tiny."""
    from attnlab.bench.encoder import MINILM

    return MINILM | {
        "vocab_size": 50,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 32,
    }


def test_onnx_runtime_runs_bertmodels_export_to_its_outputs_and_leaves_no_file(tmp_path, monkeypatch):
    """BertModel exported by torch.onnx and run by ONNX Runtime gives BertModel's last hidden state
    within 1e-5 on the same inputs; the export lives in a temporary folder, gone once it is loaded."""
    import tempfile

    import transformers

    from attnlab.bench.ort import last_hidden_state

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the temporary folders' parent
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**tiny_bert_config())).eval()
    ids = torch.randint(5, 50, (3, 7))  # (B, T), as the bench draws them
    inputs = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids)}
    run = last_hidden_state(model, inputs)
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state  # (3, 7, 16)
    assert run().shape == expected.shape and (run() - expected).abs().max() < 1e-5
    assert list(tmp_path.iterdir()) == []


def test_bench_encoder_times_onnx_runtime_on_the_same_inputs(monkeypatch, capsys):
    """With set medians (attnlab 0.5 s, ONNX Runtime 0.25 s), each fp32 backend has a record against
    ONNX Runtime (ratio 0.5) naming the threads both ran on; ONNX Runtime runs for real, on
    BertModel's export, and its output is attnlab's; bf16 has no such column. The export prints
    nothing on stdout, where the records go."""
    import attnlab.bench.encoder as encoder_bench

    monkeypatch.setattr(encoder_bench, "MINILM", tiny_bert_config())
    monkeypatch.setattr(encoder_bench, "interleaved_medians", fixed_medians({"ort": 0.25}, default=0.5))
    records = {
        r["name"]: r
        for r in encoder_bench.bench_encoder(
            batch=2, seq_len=16, precisions=("fp32", "bf16"), backends=("math", "sdpa"), repeats=1
        )
    }
    assert list(records) == [
        "encoder_fp32_math",
        "encoder_fp32_sdpa",
        "encoder_fp32_math_vs_ort",
        "encoder_fp32_sdpa_vs_ort",
        "encoder_bf16_math",
        "encoder_bf16_sdpa",
    ]
    for backend in ("math", "sdpa"):
        r = records[f"encoder_fp32_{backend}_vs_ort"]
        assert r["reference"] == "onnxruntime.InferenceSession (fp32)"
        assert (r["value"], r["reference_value"], r["ratio"]) == (64.0, 128.0, 0.5)
        assert r["max_abs_difference"] < 1e-5 and r["intra_op_num_threads"] == torch.get_num_threads()
    assert capsys.readouterr().out == ""


def test_onnx_runtime_columns_say_when_the_extra_is_missing(monkeypatch, capsys):
    """Without onnxruntime (its import fails), each ONNX Runtime column of bench encoder says so in
    its line, as transformers' columns do, and so does a bench on a GPU; --no-ort leaves them out."""
    import sys

    import attnlab.bench.encoder as encoder_bench
    from attnlab.bench.ort import unavailable
    from attnlab.cli import main

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    monkeypatch.setattr(encoder_bench, "MINILM", tiny_bert_config())
    monkeypatch.setattr(encoder_bench, "interleaved_medians", fixed_medians(default=0.5))
    command = ["bench", "encoder", "--batch", "1", "--seq-len", "4", "--repeats", "1", "--precision", "fp32"]
    assert main(command) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "_vs_ort" in line]
    assert [line.split(" tokens/s")[1] for line in lines] == [
        f"   onnxruntime.InferenceSession (fp32): skipped ({ORT_MISSING})"
    ] * 2
    assert main([*command, "--no-ort"]) == 0
    assert "_vs_ort" not in capsys.readouterr().out
    assert unavailable(CUDA) == "timed on the CPU only; this bench runs on cuda:1"
