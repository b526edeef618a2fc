"""`attnlab train --nproc-per-node N` (parallel/launch.py): the config checked before any process starts,
N ranks started as torchrun starts them, and a rank's failure reported once, in one line, with its
exit code (torchrun itself adds a ChildFailedError traceback and exits 1: issue 64)."""

from __future__ import annotations

import subprocess

from helpers import ATTNLAB

CONFIG = """\
model: {{arch: decoder_lm, stack: {{d_model: 32, n_heads: 2, n_layers: 2, d_ff: 64, dropout: 0.0}}, embeddings: {{tie: none}}}}
data: {{format: text, train: {text}, text: {{tokenizer: char}}, block_size: 16}}
train: {{max_steps: 2, batch_size: 4, lr_schedule: constant, lr: 0.003, warmup_steps: 1, eval_every: 2,
        progress: false}}
"""


def write_config(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("jump twice\nwalk left\nrun right thrice\nlook\n" * 50)
    config = tmp_path / "lm.yaml"
    config.write_text(CONFIG.format(text=text))
    return config


def train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ATTNLAB, "train", *args], capture_output=True, text=True, timeout=300)


def test_a_config_the_ranks_would_refuse_is_one_line_before_any_process_starts(tmp_path):
    config = write_config(tmp_path)
    refused = train(
        str(config),
        "--out",
        str(tmp_path / "run"),
        "--nproc-per-node",
        "2",
        "--set",
        "train.strategy=tp",
        "--set",
        "model.stack.n_heads=3",
        "--set",
        "model.stack.d_model=48",
    )
    assert (refused.returncode, refused.stdout) == (3, "")
    assert refused.stderr == (
        "error: train.strategy tp: model.stack.n_heads (3) must be divisible by the tensor-parallel size (2 ranks)\n"
    )
    assert not (tmp_path / "run").exists()
    bad = train(str(config), "--out", str(tmp_path / "run"), "--nproc-per-node", "0")
    assert (bad.returncode, bad.stderr) == (2, "error: --nproc-per-node must be at least 1 (got 0)\n")


def test_two_ranks_train_and_a_rank_s_failure_is_its_one_line_and_exit_code(tmp_path):
    config = write_config(tmp_path)
    done = train(str(config), "--out", str(tmp_path / "run"), "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("run directory: ") == 1 and (tmp_path / "run" / "summary.json").is_file()
    # 3 micro-batches cannot divide a batch of 4 rows: found by the ranks once their data is ready, before
    # the run directory is written (a retry with another value is not refused as an existing run)
    failed = train(
        str(config),
        "--out",
        str(tmp_path / "pp"),
        "--nproc-per-node",
        "2",
        "--set",
        "train.strategy=pp",
        "--set",
        "train.micro_batches=3",
    )
    assert failed.returncode == 3
    errors = [line for line in failed.stderr.splitlines() if line.strip()]
    assert errors == [
        "error: train.strategy pp cuts every batch into train.micro_batches equal micro-batches: "
        "train.micro_batches (3) must divide train.batch_size (4)"
    ], failed.stderr
    assert not (tmp_path / "pp").exists()
