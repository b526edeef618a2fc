"""The `attnlab` command end to end."""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main, make_parser
from attnlab.errors import CheckpointError, ConfigError
from attnlab.runs.run_dir import RunDir

from helpers import ATTNLAB, fixed_medians, run_cli, sized

ROOT = Path(__file__).resolve().parents[1]


def test_info_base_preset_has_the_papers_parameter_count(capsys):
    assert main(["info", str(ROOT / "configs/transformer_base.yaml"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["params_total"] == 63_082_496
    assert report["components"] == {"src_embed": 18_944_000, "encoder": 18_914_304, "decoder": 25_224_192}
    assert report["layers"]["encoder.layers.0"] == {
        "self_attention": 1_050_624,
        "norm": 2_048,
        "feed_forward": 2_099_712,
    }
    assert report["layers"]["decoder.layers.5"]["cross_attention"] == 1_050_624


def test_info_big_preset(capsys):
    assert main(["info", str(ROOT / "configs/transformer_big.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params_total"] == 214_245_376


def test_info_table_runs_as_a_console_script():
    done = subprocess.run(
        [*ATTNLAB, "info", str(ROOT / "configs/transformer_base.yaml")], capture_output=True, text=True, check=True
    )
    assert "63,082,496" in done.stdout
    assert "encoder.layers.0-5" in done.stdout and "3,152,384 each" in done.stdout


@pytest.mark.parametrize(
    "text,code,message",
    [
        (None, 3, "no such config file"),
        (
            "model:\n  stack: {n_heads: 3}\nshape: {vocab_size: 10}\n",
            3,
            "d_model (512) must be divisible by n_heads (3)",
        ),
        ("model: [1\n", 3, "YAML does not parse"),
        (
            "model: {arch: decoder_lm}\n",
            3,
            "a model config without a data section gives its data's sizes as a 'shape' "
            "section (shape: {vocab_size: V}), or --vocab-size V",
        ),
        ("model: {arch: decoder_lm}\nshape: {vocab: 10}\n", 3, "shape: unknown size 'vocab' (one of channels, "),
        (
            "model: {arch: vit, patches: {size: 5}}\nshape: {channels: 1, image_height: 8, image_width: 8, n_classes: 3}\n",
            3,
            "image_height (8) must be divisible by patches.size (5)",
        ),
        (
            "model: {arch: decoder_lm}\ndata: {format: text, train: t.txt}\nshape: {vocab_size: 10}\n",
            3,
            "section 'shape' gives the sizes of a model config without data; a training config's come from its data",
        ),
    ],
)
def test_bad_config_is_one_line_and_an_exit_code(tmp_path, text, code, message):
    path = tmp_path / "c.yaml"
    if text is not None:
        path.write_text(text)
    done = run_cli("info", str(path))
    assert done.returncode == code
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0] and str(path) in lines[0]


def test_usage_error_and_debug(tmp_path, capsys):
    assert main(["info"]) == 2
    assert "required: config" in capsys.readouterr().err
    with pytest.raises(Exception, match="no such config file"):
        main(["--debug", "info", str(tmp_path / "none.yaml")])


def tiny_parallel_corpus(tmp_path):
    """A toy German -> English corpus written by the test: numbers as words."""
    de = "null eins zwei drei vier fünf sechs sieben acht neun".split()
    en = "zero one two three four five six seven eight nine".split()
    import random

    rng = random.Random(0)
    rows = [[rng.randrange(10) for _ in range(rng.randint(1, 4))] for _ in range(400)]
    for split, chunk in (("train", rows[:360]), ("val", rows[360:])):
        (tmp_path / f"{split}.de").write_text("".join(" ".join(de[i] for i in r) + "\n" for r in chunk))
        (tmp_path / f"{split}.en").write_text("".join(" ".join(en[i] for i in r) + "\n" for r in chunk))
    config = tmp_path / "tiny.yaml"
    config.write_text(f"""\
model: {{stack: {{d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64, dropout: 0.0, norm: pre}}}}
data: {{format: parallel, train: {tmp_path}/train, valid: {tmp_path}/val,
       pairs: {{src_lang: de, tgt_lang: en, shared_vocab: false}}, text: {{tokenizer: word}}}}
train: {{max_steps: 250, max_tokens: 400, lr_schedule: constant, lr: 0.003, warmup_steps: 10,
        eval_every: 125, eval_exact_match: 40, early_stop_metric: exact_match, log_every: 10}}
""")
    return config


def test_train_end_to_end_on_a_tiny_parallel_corpus(tmp_path):
    config = tiny_parallel_corpus(tmp_path)
    out = tmp_path / "run"
    done = run_cli("train", str(config), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == f"run directory: {out}"
    assert re.search(r"^stopped after 250 steps \(max_steps\), \d+\.\d s of training$", done.stdout, re.M)
    assert "step" in done.stderr  # the progress bar
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 250 and summary["n_params"] > 0 and summary["train_seconds"] >= 0
    assert summary["last_eval"]["exact_match"] >= 0.9
    assert (out / "tokenizer-src.json").exists() and (out / "tokenizer-tgt.json").exists()
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert {"loss", "lr", "grad_norm", "tokens_per_s"} <= set(train[0]) and train[-1]["loss"] < train[0]["loss"]
    # a second run into the same directory is refused, and nothing in it is touched
    before = (out / "summary.json").read_bytes()
    again = run_cli("train", str(config), "--out", str(out))
    assert again.returncode == 2 and "already exists" in again.stderr and (out / "summary.json").read_bytes() == before
    # --resume continues the run with its own config; changed train settings need --allow-changes, and are recorded
    more = run_cli(
        "train",
        "--out",
        str(out),
        "--resume",
        "--allow-changes",
        "--set",
        "train.max_steps=260",
        "--set",
        "train.eval_every=130",
    )
    assert more.returncode == 0, more.stderr
    assert (
        "train settings changed at step 250: train.eval_every: 125 -> 130; train.max_steps: 250 -> 260" in more.stdout
    )
    assert json.loads((out / "summary.json").read_text())["steps"] == 260
    record = json.loads((out / "config_changes.jsonl").read_text())
    assert record["step"] == 250 and record["changes"] == [
        "train.eval_every: 125 -> 130",
        "train.max_steps: 250 -> 260",
    ]
    assert "max_steps: 260" in (out / "config.yaml").read_text()
    avg = run_cli("average", str(out), "--last", "2")
    assert avg.returncode == 0 and "averaged steps 250, 260" in avg.stdout
    again = run_cli("average", str(out), "--last", "1", "--force")
    assert again.returncode == 0 and "averaged steps 260" in again.stdout
    kept = len(list((out / "checkpoints").glob("step-*")))
    every = run_cli("average", str(out), "--last", "100", "--force")  # more than the run keeps: said, not silent
    assert (
        every.returncode == 0
        and every.stderr
        == (
            f"note: --last 100 asked for more checkpoints than the run keeps; averaged all {kept} (train.keep_last sets "
            f"how many a run keeps)\n"
        )
        and every.stdout.startswith("averaged steps ")
        and kept >= 2
    )
    bad = run_cli("average", str(out), "--last", "0")
    assert bad.returncode == 2 and "--last must be at least 1" in bad.stderr
    # bad decoding input: one line, an exit code, nothing overwritten
    for args, stdin, message in (
        ([], b"drei \xff eins\n", "<stdin>:1: not valid UTF-8"),
        (["--output", str(tmp_path)], b"eins\n", "is a directory"),
        (["--min-len", "5", "--max-len", "2"], b"eins\n", "--min-len (5) must not exceed --max-len (2)"),
    ):
        bad = run_cli("translate", str(out), *args, stdin=stdin)
        err = bad.stderr
        assert bad.returncode in (2, 4) and err.startswith("error: ") and message in err and "Traceback" not in err
    written = tmp_path / "out.txt"
    first = subprocess.run([*ATTNLAB, "translate", str(out), "--output", str(written)], input=b"eins zwei\n")
    assert first.returncode == 0 and written.read_text().strip() == "one two"
    assert oct(written.stat().st_mode & 0o777) != oct(0o600)  # a normal file, not a private temp file
    # the run directory is all that decoding needs
    from attnlab.decode.search import greedy
    from attnlab.runs.checkpoint import load_run

    for checkpoint in ("best", "last", "average", "250"):
        model, toks, _ = load_run(out, checkpoint)
        src = torch.tensor([toks["src"].encode("drei eins vier") + [2]])
        assert toks["tgt"].decode(greedy(model, src)[0]) == "three one four", checkpoint


@pytest.mark.parametrize(
    "args,message",
    [
        (["--set", "train.max_steps"], "expected section.field=value"),
        (["--set", "trian.max_steps=3"], "unknown section 'trian' (did you mean 'train'?)"),
        (["--set", "train.max_step=3"], "unknown field 'max_step' in section 'train' (did you mean 'max_steps'?)"),
        (["--set", "train.max_steps=[1"], "the value does not parse"),
        (["--set", "model.vocab_size=10"], "model.vocab_size is set by the data, not the model section: remove it"),
    ],
)
def test_train_rejects_bad_overrides(tmp_path, args, message):
    config = tiny_parallel_corpus(tmp_path)
    done = run_cli("train", str(config), "--out", str(tmp_path / "r"), *args)
    assert done.returncode == ConfigError.exit_code and message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "r").exists()


def test_demo_with_a_small_budget(tmp_path):
    out = tmp_path / "demo"
    done = run_cli(
        "demo",
        "--out",
        str(out),
        "--set",
        "train.max_steps=20",
        "--set",
        "train.eval_every=10",
        "--set",
        "data.n_test=30",
        "--set",
        "train.progress=false",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == f"run directory: {out}"
    assert any(line.startswith("exact match on 30 held-out commands:") for line in lines)
    assert sum(line.strip().startswith("source:") for line in lines) == 5
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["exact_match"] <= 1.0 and summary["train_seconds"] >= 0 and summary["n_params"] > 0
    from attnlab.runs.checkpoint import load_run

    model, tokenizers, cfg = load_run(out)  # the run directory loads again for decoding
    assert cfg.arch == "encoder_decoder" and tokenizers["src"] is tokenizers["tgt"]

    # translate and evaluate on the demo's run directory; --no-cache changes nothing
    commands = tmp_path / "commands.txt"
    commands.write_text("jump twice\nwalk left after look\nturn around right thrice\n")
    actions = tmp_path / "actions.txt"
    actions.write_text("I_JUMP I_JUMP\nI_LOOK I_TURN_LEFT I_WALK\n" + " ".join(["I_TURN_RIGHT"] * 12) + "\n")
    outputs = {}
    for flags in ([], ["--no-cache"], ["--beam", "1"], ["--beam", "1", "--no-cache"]):
        done = run_cli("translate", str(out), "--input", str(commands), *flags)
        assert done.returncode == 0, done.stderr
        outputs[tuple(flags)] = done.stdout
    assert len(outputs[()].splitlines()) == 3
    assert (
        outputs[()] == outputs[("--no-cache",)] and outputs[("--beam", "1")] == outputs[("--beam", "1", "--no-cache")]
    )
    piped = run_cli("translate", str(out), stdin=commands.read_text())
    assert piped.stdout == outputs[()]
    # speculative decoding with the run itself as draft: greedy's output, every proposal accepted
    drafted = run_cli("translate", str(out), "--input", str(commands), "--beam", "1", "--draft", str(out))
    assert drafted.stdout == outputs[("--beam", "1")] and "accepted (100.0%)" in drafted.stderr
    refused = run_cli("translate", str(out), "--input", str(commands), "--draft", str(out))
    assert refused.returncode == 2 and refused.stderr == (
        "error: --draft decodes greedily: give --beam 1, no --nbest or --min-len, and --speculate >= 1\n"
    )
    nbest = run_cli("translate", str(out), "--input", str(commands), "--beam", "3", "--nbest", "2").stdout.splitlines()
    assert [line.split(" ||| ")[0] for line in nbest] == ["0", "0", "1", "1", "2", "2"]
    assert float(nbest[0].split(" ||| ")[2]) >= float(nbest[1].split(" ||| ")[2])
    done = run_cli("evaluate", str(out), "--src", str(commands), "--ref", str(actions), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert 0 <= result["bleu"] <= 100 and 0 <= result["exact_match"] <= 1 and result["ppl"] >= 1
    text = run_cli("evaluate", str(out), "--src", str(commands), "--ref", str(actions)).stdout
    assert text.startswith("BLEU ") and "chrF " in text and "exact match" in text
    assert text.splitlines()[-1] == "(3 sentences, beam 4, lenpen 0.6)"
    greedy = run_cli("evaluate", str(out), "--src", str(commands), "--ref", str(actions), "--beam", "1")
    assert greedy.stdout.splitlines()[-1] == "(3 sentences, greedy (beam 1))"  # no length penalty to report
    greedy = run_cli("evaluate", str(out), "--src", str(commands), "--ref", str(actions), "--beam", "1", "--json")
    assert json.loads(greedy.stdout)["lenpen"] is None
    scored = run_cli("score", str(out), "--src", str(commands), "--tgt", str(actions), "--json")
    record = json.loads(scored.stdout)
    assert record["ppl"] == pytest.approx(result["ppl"], rel=1e-4)
    readable = run_cli("score", str(out), "--src", str(commands), "--tgt", str(actions)).stdout
    assert readable == (
        f"perplexity {record['ppl']:.4g}: {record['nll_per_token']:.4f} nats per token over "
        f"{record['tokens']:,} tokens ({actions})\n"
    )
    wrong = run_cli("generate", str(out))
    assert wrong.returncode == 2 and wrong.stderr == (
        f"error: {out} is a run of data.task 'translation'; `attnlab generate` needs data.task 'language_model' "
        f"or 'segment_language_model' (this run's commands: translate, evaluate, score, inspect, prune)\n"
    )


def test_generate_and_score_a_language_model(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question. " * 100)
    config = tmp_path / "lm.yaml"
    config.write_text(f"""\
model: {{arch: decoder_lm, stack: {{d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64, dropout: 0.0}}, positions: {{scheme: rotary}}}}
data: {{format: text, train: {text}, text: {{tokenizer: char}}, block_size: 32}}
train: {{max_steps: 80, batch_size: 8, lr_schedule: constant, lr: 0.003, warmup_steps: 5, label_smoothing: 0.0,
        eval_every: 80}}
""")
    out = tmp_path / "lm"
    assert run_cli("train", str(config), "--out", str(out)).returncode == 0
    run = lambda *a: run_cli("generate", str(out), *a)
    first = run("--prompt", "to be", "--max-new-tokens", "20", "--seed", "3")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("to be") and len(first.stdout.rstrip("\n")) == 25
    assert run("--prompt", "to be", "--max-new-tokens", "20", "--seed", "3").stdout == first.stdout
    greedy = run("--prompt", "to be", "--max-new-tokens", "20", "--top-k", "1", "--seed", "1").stdout
    assert greedy == run("--prompt", "to be", "--max-new-tokens", "20", "--top-k", "1", "--seed", "2").stdout
    # speculative decoding with a draft (here the run itself: every proposal is accepted) keeps greedy's text
    fast = run(
        "--prompt",
        "to be",
        "--max-new-tokens",
        "20",
        "--top-k",
        "1",
        "--seed",
        "1",
        "--draft",
        str(out),
        "--speculate",
        "3",
    )
    assert fast.returncode == 0 and fast.stdout == greedy
    assert fast.stderr == (
        "speculative decoding, k 3: 15 of 15 draft tokens accepted (100.0%), 4.00 tokens per pass of the target\n"
    )
    assert run("--draft", str(out), "--speculate", "0").stderr == "error: --speculate must be at least 1 (got 0)\n"
    for weights in ("bf16", "int8"):  # the weights' effect on the numbers: tests/test_weights.py
        lower = run("--prompt", "to be", "--max-new-tokens", "20", "--top-k", "1", "--seed", "1", "--weights", weights)
        assert lower.returncode == 0 and lower.stdout.startswith("to be") and len(lower.stdout.rstrip("\n")) == 25
    two = run("--prompt", "to", "--max-new-tokens", "5", "--num-samples", "2", "--top-p", "0.9").stdout
    assert two.count("--- sample") == 2
    unlimited = run("--prompt", "to be", "--max-new-tokens", "20", "--top-k", "0", "--seed", "3")
    assert unlimited.returncode == 0 and unlimited.stdout == first.stdout  # 0: no limit, as in Hugging Face
    noted = run("--prompt", "to bé€", "--max-new-tokens", "2", "--seed", "3")
    assert noted.returncode == 0 and noted.stderr == "note: 2 unknown prompt tokens were read as <unk>\n"
    assert noted.stdout.startswith("to bé€")
    for bad in (["--temperature", "0"], ["--top-k", "-1"], ["--top-p", "1.5"], ["--max-new-tokens", "100001"]):
        refused = run(*bad)
        assert refused.returncode == 2 and refused.stderr.startswith("error: ") and "Traceback" not in refused.stderr
    scored = run_cli("score", str(out), "--tgt", str(text), "--json")
    assert scored.returncode == 0, scored.stderr
    assert 1.0 <= json.loads(scored.stdout)["ppl"] < 10.0


def test_bench_decode_reports_greedy_beam_and_the_cache_speedup(monkeypatch):
    # set medians (each search still runs once): the figures are exact, whatever the machine's load
    seconds = {"decode_greedy": 0.3, "decode_greedy_nocache": 2.2}
    monkeypatch.setattr("attnlab.bench.decode.interleaved_medians", fixed_medians(seconds, default=0.5))
    done = run_cli(
        "bench", "decode", "--new-tokens", "4", "--batch", "2", "--repeats", "1", "--no-hf", "--no-ct2", "--json"
    )
    assert done.returncode == 0, done.stderr
    records = {r["name"]: r for r in map(json.loads, done.stdout.splitlines())}
    # the default weights are fp32 and int8: each decodes greedily and with beam 5
    assert set(records) == {
        "decode_greedy",
        "decode_beam5",
        "decode_greedy_nocache",
        "decode_cache_speedup",
        "decode_greedy_int8",
        "decode_beam5_int8",
    }
    for name in ("decode_greedy", "decode_beam5", "decode_greedy_nocache", "decode_greedy_int8", "decode_beam5_int8"):
        assert records[name]["unit"] == "tokens/s" and records[name]["new_tokens"] == 4
        assert records[name]["value"] == round(2 * 4 / seconds.get(name, 0.5), 1)
    # speedup = t_nocache / t_cache from the unrounded medians, rounded to 0.01 (not 26.7 / 3.6 of the
    # 0.1-rounded tokens/s: a ratio of rounded figures, checked at a fixed tolerance, failed by chance)
    assert records["decode_cache_speedup"]["value"] == 7.33
    bad = run_cli("bench", "decode", "--repeats", "0")
    assert bad.returncode == 2 and "--repeats" in bad.stderr


# The parameters of every preset: the count with its vocabulary V, and that V. The first six are the counts
# that docs/results/ (scan.md, translation.md, character_lm.md) and docs/rnn_vs_transformer.md report from the runs' own logs; the other four are
# worked out by hand from the configs (d = d_model, a layer norm has 2d, a linear layer in x out + out):
# - rnn_luong, V = 8000 (data.vocab_size), d = 512: bidirectional GRU encoder 2 x 3(d.d + d.d + 2d),
#   W_init 2d.d + d, decoder GRU over [E y; h~] 3(2d.d + d.d + 2d), W_c 3d.d + d, general score W_a 2d.d
#   (no bias) = 28d^2 + 20d = 7,350,272; source and target tables 2Vd, W_out tied: 15,542,272.
# - scan, scan_simple, V = 23 (<pad> <bos> <eos> <unk>, SCAN's 13 command words and 6 actions), d = 128,
#   2 pre-norm layers, 4 heads, d_ff 256, rotary positions, one tied table: attention 4(d.d + d) = 66,048,
#   feed-forward 2 x 128 x 256 + 256 + 128 = 65,920; encoder 2(66,048 + 65,920 + 2 x 256) + 256 = 265,216,
#   decoder 2(2 x 66,048 + 65,920 + 3 x 256) + 256 = 397,824, table 23 x 128 = 2,944: 665,984.
# - scan_simple_rnn, V = 23, d = 128, Bahdanau's additive score: encoder 12d^2 + 12d, W_init 2d^2 + d, decoder
#   GRU over [E y; c] 3(3d.d + d.d + 2d), W_o 4d.d + d, score W_s d.d + W_h 2d.d + v_a d = 33d^2 + 21d
#   = 543,360; tables 2Vd = 5,888: 549,248.
PRESET_PARAMETERS = {
    "multi30k_de_en": (7_577_600, 8000),
    "rnn_bahdanau": (16_853_504, 8000),
    "rnn_fixed_context": (16_066_560, 8000),
    "shakespeare_char": (810_368, 69),
    "transformer_base": (63_082_496, 37000),
    "transformer_big": (214_245_376, 37000),
    "rnn_luong": (15_542_272, 8000),
    "scan": (665_984, 23),
    "scan_simple": (665_984, 23),
    "scan_simple_rnn": (549_248, 23),
}


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_info_counts_every_preset(config, capsys):
    """Model configs have their vocabulary; training configs get theirs from the data, which info
    does not read: it reports parameters = fixed + per_entry x V, exact for every V."""
    name = config.removesuffix(".yaml")
    assert name in PRESET_PARAMETERS, f"configs/{config} needs its expected parameter count in PRESET_PARAMETERS"
    expected, vocab = PRESET_PARAMETERS[name]
    assert main(["info", str(ROOT / "configs" / config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    if "params_total" in report:
        total = report["params_total"]
    else:
        assert report["vocab_size"] is None and report["params_per_vocab_entry"] > 0
        total = report["params_without_vocab"] + report["params_per_vocab_entry"] * vocab
        assert main(["info", str(ROOT / "configs" / config), "--vocab-size", str(vocab), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["params_total"] == total  # the formula is the count
    assert total == expected


def test_info_counts_models_of_images_and_graphs_and_refuses_their_token_budgets():
    vit = run_cli("info", str(ROOT / "recipes/digits/vit.yaml"))
    assert vit.returncode == 0 and vit.stdout.startswith(
        f"{ROOT / 'recipes/digits/vit.yaml'}: vit, d_model 64, 4 heads"
    )
    graph = run_cli("info", str(ROOT / "recipes/karate/graph.yaml"), "--json")
    assert graph.returncode == 0 and json.loads(graph.stdout)["arch"] == "graph"
    refused = run_cli("info", str(ROOT / "recipes/digits/vit.yaml"), "--flops")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: --memory and --flops measure models of token sequences; arch 'vit' reads images; without them, "
        "info counts its parameters"
    ]


def test_info_takes_overrides_and_a_run_directory(tmp_path, capsys):
    assert main(["info", str(ROOT / "configs/transformer_base.yaml"), "--set", "model.stack.n_layers=3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params_total"] == 63_082_496 - 3 * (3_152_384 + 4_204_032)
    assert main(["info", str(ROOT / "configs/scan.yaml"), "--json"]) == 0  # a built-in task: its tokenizer is built
    assert json.loads(capsys.readouterr().out)["params_total"] == 665_984
    assert main(["info", str(ROOT / "configs/scan.yaml"), "--set", "model.n_layer=3"]) == ConfigError.exit_code
    assert "unknown field 'n_layer' in section 'model' (did you mean 'stack.n_layers'?)" in capsys.readouterr().err
    config = tiny_parallel_corpus(tmp_path)
    assert main(["train", str(config), "--out", str(tmp_path / "run"), "--set", "train.max_steps=2"]) == 0
    logged = capsys.readouterr().out
    assert main(["info", str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params_total"] == json.loads(logged.splitlines()[-2])["n_params"]
    assert main(["info", str(tmp_path)]) == CheckpointError.exit_code
    assert "is a directory but not a run directory" in capsys.readouterr().err


def every_option(parser, path=("attnlab",)):
    """(command path, option) for every argument of every (sub)command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_option(sub, (*path, name))
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield " ".join(path), "/".join(action.option_strings) or action.dest, action.help


def test_every_option_has_help_text_and_there_is_a_version():
    missing = [f"{command} {option}" for command, option, text in every_option(make_parser()) if not text]
    assert missing == []
    done = subprocess.run([*ATTNLAB, "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == f"attnlab {attnlab.__version__}\n"


# What a command that touches no model must not import: each costs a start-up of a second or more
# (torch alone ~1.4 s), and `--version`, `--help` and `data list` answer in well under 0.3 s without them.
HEAVY_MODULES = ("torch", "numpy", "tokenizers", "transformers", "matplotlib", "sacrebleu", "safetensors")

# `python -m attnlab.cli ARGS` in a wrapper that reports, after the command, which of them it imported.
IMPORTED_AFTER = """
import json, runpy, sys
heavy, sys.argv = json.loads(sys.argv[1]), ["attnlab", *sys.argv[2:]]
try:
    runpy.run_module("attnlab.cli", run_name="__main__", alter_sys=True)
except SystemExit as end:
    code = end.code
sys.stdout.flush()
print("imported: " + json.dumps([name for name in heavy if name in sys.modules]), file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.parametrize(
    "args,prints", [(["--version"], "attnlab "), (["--help"], "usage: attnlab"), (["data", "list"], "multi30k")]
)
def test_version_help_and_data_list_start_without_torch(args, prints):
    """Deterministic, not timed: the command runs and exits 0, and none of the heavy modules is in
    sys.modules afterwards (each command imports those it needs when it runs)."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED_AFTER, json.dumps(HEAVY_MODULES), *args], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert prints in done.stdout
    assert done.stderr.splitlines()[-1] == "imported: []"


def tiny_lm_run(tmp_path) -> Path:
    """A character LM trained for 2 steps: enough to sample from."""
    text = tmp_path / "text.txt"
    text.write_text("abcdefgh\n" * 50)  # the newline: generate's default prompt is a known token
    config = tmp_path / "lm.yaml"
    config.write_text(
        f"model: {{arch: decoder_lm, stack: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32}}}}\n"
        f"data: {{format: text, train: {text}, text: {{tokenizer: char}}, block_size: 16}}\n"
        f"train: {{max_steps: 2, batch_size: 4, eval_every: 2, progress: false}}\n"
    )
    assert main(["train", str(config), "--out", str(tmp_path / "lm")]) == 0
    return tmp_path / "lm"


def test_generate_without_a_seed_draws_one_and_says_which(tmp_path, monkeypatch, capsys):
    tiny_lm_run(tmp_path)
    capsys.readouterr()
    monkeypatch.setattr("secrets.randbelow", lambda n: 1234)
    assert main(["generate", str(tmp_path / "lm"), "--max-new-tokens", "30"]) == 0
    drawn = capsys.readouterr()
    assert drawn.err == "seed 1234 (--seed 1234 gives this text again)\n"
    assert main(["generate", str(tmp_path / "lm"), "--max-new-tokens", "30", "--seed", "1234"]) == 0
    again = capsys.readouterr()
    assert again.out == drawn.out and again.err == ""


def test_a_closed_pipe_ends_quietly(tmp_path):
    run = tiny_lm_run(tmp_path)
    process = subprocess.Popen(
        [*ATTNLAB, "generate", str(run), "--max-new-tokens", "20", "--seed", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # the reader has gone before the first line, as with `| head -0`: every write fails
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 128 + signal.SIGPIPE
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err


def default_sigint() -> None:
    """Ctrl-C's default action in the child, as a terminal gives it: a suite started in the
    background (`make test &`) has SIGINT ignored, and a child inherits that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_saves_the_step_it_reached_says_so_and_resumes_from_it(tmp_path):
    """Ctrl-C finishes the update in flight and writes a checkpoint of that step, not evaluated
    (issue 37: an interrupt at step 101 of a run evaluated every 500 kept step 75), then says what
    it saved in one line that is not an error; --resume continues from that step."""
    config = tiny_parallel_corpus(tmp_path)
    out = tmp_path / "run"
    process = subprocess.Popen(
        [
            *ATTNLAB,
            "train",
            str(config),
            "--out",
            str(out),
            "--set",
            "train.max_steps=100000",
            "--set",
            "train.eval_every=1000",
            "--set",
            "train.log_every=1",
            "--set",
            "train.progress=false",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while (
        (not metrics.exists() or len(metrics.read_text().splitlines()) < 3)
        and time.monotonic() < deadline
        and process.poll() is None
    ):
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    steps = RunDir(out).steps()
    step = steps[-1]
    assert steps == [step] and 3 <= step < 1000 and RunDir(out).was_interrupted(step)  # no evaluation came first
    assert err.strip().splitlines()[-1] == (
        f"interrupted: {out} is saved up to step {step} (a checkpoint of the step it had reached, not evaluated); "
        f"continue with `attnlab train --out {out} --resume`"
    )
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "error" not in err
    resumed = run_cli("train", "--out", str(out), "--resume", "--allow-changes", "--set", f"train.max_steps={step + 2}")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "summary.json").read_text())["steps"] == step + 2
    logged = [
        json.loads(line)["step"] for line in metrics.read_text().splitlines() if json.loads(line)["split"] == "train"
    ]
    assert logged == list(range(1, step + 3))  # every step once: none lost, none twice


def test_bench_decode_says_when_the_hugging_face_reference_is_left_out(monkeypatch, capsys):
    monkeypatch.setattr("attnlab.bench.decode.marian", lambda dropout: None)  # as when transformers is missing
    assert main(["bench", "decode", "--new-tokens", "2", "--batch", "1", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    skipped = "   transformers.MarianMTModel: skipped (transformers is not installed (pip install 'attnlab[bench]'))"
    assert [line.split(" tokens/s")[1] for line in lines[:3]] == [skipped] * 3


def test_blank_lines_stay_blank_and_empty_input_is_empty_output(tmp_path):
    config = tiny_parallel_corpus(tmp_path)
    assert main(["train", str(config), "--out", str(tmp_path / "run"), "--set", "train.max_steps=2"]) == 0
    translate = lambda *args, stdin="": run_cli("translate", str(tmp_path / "run"), *args, stdin=stdin)
    for beam in ("1", "3"):
        done = translate("--beam", beam, stdin="eins zwei\n\n   \ndrei\n")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.split("\n")
        assert len(lines) == 5 and lines[1] == lines[2] == "" and lines[4] == ""
    nbest = translate("--beam", "3", "--nbest", "2", stdin="eins\n\n").stdout.splitlines()
    assert nbest[2] == "1 |||  ||| 0.0000" and len(nbest) == 3
    empty = tmp_path / "empty.de"
    empty.write_text("")
    from_stdin, from_file = translate(), translate("--input", str(empty))
    assert from_stdin.returncode == from_file.returncode == 0 and from_stdin.stdout == from_file.stdout == ""
    assert from_stdin.stderr == "note: <stdin> is empty: nothing to translate\n"
    assert from_file.stderr == f"note: {empty} is empty: nothing to translate\n"


def test_info_counts_a_model_config_of_any_family_from_its_shape_section(tmp_path):
    """A model config without data gives the data's sizes in its 'shape' section (an image's, here):
    info counts the model those sizes build, and --vocab-size sets a vocabulary in it."""
    from attnlab import build_model

    path = tmp_path / "vit.yaml"
    path.write_text(
        "model: {arch: vit, patches: {size: 4}, stack: {d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64}}\n"
        "shape: {channels: 1, image_height: 8, image_width: 12, n_classes: 3}\n"
    )
    done = run_cli("info", str(path), "--json")
    assert done.returncode == 0, done.stderr
    model = build_model(
        *sized(
            arch="vit",
            patches={"size": 4},
            stack=dict(d_model=32, n_heads=2, n_layers=1, d_ff=64),
            channels=1,
            image_height=8,
            image_width=12,
            n_classes=3,
        )
    )
    assert json.loads(done.stdout)["params_total"] == sum(p.numel() for p in model.parameters())
    (tmp_path / "lm.yaml").write_text(
        "model: {arch: decoder_lm, stack: {d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32}}\n"
    )
    counts = [
        json.loads(run_cli("info", str(tmp_path / "lm.yaml"), "--vocab-size", str(v), "--json").stdout)["params_total"]
        for v in (100, 101)
    ]
    assert counts[1] - counts[0] == 16  # one more row of the tied token table
