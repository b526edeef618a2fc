"""torchrun with 2 CPU processes (gloo): the gradients and one update equal a single process's over
the same global batch, with and without gradient accumulation; `attnlab train` runs unchanged
under torchrun and matches a single process that accumulates the same global batches; a worker
leaves the group and ends without the interpreter's shutdown, keeping its exit status and output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.runs.checkpoint import load_run

from ddp_worker import CFG, setup, update
from helpers import ATTNLAB, TORCHRUN, assert_sgd_step_close, why

TESTS = Path(__file__).resolve().parent
# PYTHONPATH (this checkout first): tests/conftest.py. PYTHONFAULTHANDLER: a worker that crashes prints
# every thread's Python stack (helpers.why shows it), as one did once in CI at 50cae28: rank 0 of an fsdp+tp
# run died of SIGSEGV, not reproduced since in 32 runs of that launch (12 quiet, 20 beside 2 busy processes).
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}


def torchrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TORCHRUN, "--standalone", "--nproc_per_node", "2", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=180,
    )


def assert_same_weights(run_a: Path, run_b: Path) -> None:
    """Equal to the bit: the two runs do the same float32 operations in the same order. Both run
    with one thread (ENV); each rank's forward and backward is the one process's on that batch; the
    all-reduce of 2 ranks adds the same two gradients that the one process accumulates (a + b is
    b + a in floating point too); the world-size factors are powers of two, so exact. A tolerance
    would follow from nothing here: after Adam steps, the key biases (whose exact gradient is 0, as
    the softmax ignores a constant added to a row's scores, so their computed gradient is rounding
    noise) differ by about lr per step as soon as any rounding differs (see tests/ddp_worker.py)."""
    a, b = load_run(run_a, "last")[0].state_dict(), load_run(run_b, "last")[0].state_dict()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0, msg=lambda m: f"{run_a.name} {name}: {m}")


def train_under_torchrun_and_accumulating(config: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """`attnlab train` on 2 ranks (into tmp_path/ddp) and in one process accumulating 2 batches
    (tmp_path/single) end with the same weights; returns the torchrun run."""
    ddp = torchrun("-m", "attnlab.cli", "train", str(config), "--out", str(tmp_path / "ddp"))
    assert ddp.returncode == 0, why(ddp)
    single = subprocess.run(
        [*ATTNLAB, "train", str(config), "--out", str(tmp_path / "single"), "--set", "train.accumulate=2"],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert single.returncode == 0, why(single)
    assert_same_weights(tmp_path / "ddp", tmp_path / "single")
    return ddp


@pytest.mark.parametrize("per_rank", [1, 2], ids=["one batch per rank", "accumulating two per rank"])
def test_two_processes_give_one_processs_gradients_and_update(tmp_path, per_rank):
    out = tmp_path / "ddp.pt"
    done = torchrun(str(TESTS / "ddp_worker.py"), str(out), str(per_rank))
    assert done.returncode == 0, why(done)
    ddp = torch.load(out)
    assert ddp["left_group"]  # a gloo group left to the interpreter's exit can abort the process
    model, batches = setup()
    grads, weights = update(model, batches[: 2 * per_rank])  # the same global batch in one process
    # the gradients: the same sums in another order (ranks, accumulation, thread counts)
    atol, rtol = 1e-6, 1e-5
    for name, g in grads.items():
        torch.testing.assert_close(ddp["grads"][name], g, atol=atol, rtol=rtol, msg=lambda m: f"grad {name}: {m}")
    assert_sgd_step_close(ddp["weights"], weights, grads, CFG.lr, atol, rtol)


def test_attnlab_train_under_torchrun_matches_one_process_accumulating(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text("""\
model: {stack: {d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64, dropout: 0.0}}
data: {format: builtin, generator: {name: reverse}, text: {tokenizer: word}, n_train: 300, n_valid: 20, n_test: 20}
train: {max_steps: 6, max_tokens: 200, lr_schedule: constant, lr: 0.002, warmup_steps: 2, eval_every: 3,
        log_every: 1, progress: false}
""")
    ddp = train_under_torchrun_and_accumulating(config, tmp_path)
    assert ddp.stdout.count("run directory:") == 1  # rank 0 alone reports
    lines = [json.loads(x) for x in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]  # written once, by rank 0
    # resumed under torchrun to step 9, it equals one process that ran 9 steps straight
    resumed = torchrun(
        "-m",
        "attnlab.cli",
        "train",
        str(config),
        "--out",
        str(tmp_path / "ddp"),
        "--resume",
        "--allow-changes",
        "--set",
        "train.max_steps=9",
    )
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, why(resumed)
    straight = subprocess.run(
        [
            *ATTNLAB,
            "train",
            str(config),
            "--out",
            str(tmp_path / "straight"),
            "--set",
            "train.accumulate=2",
            "--set",
            "train.max_steps=9",
        ],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert straight.returncode == 0, why(straight)
    assert_same_weights(tmp_path / "ddp", tmp_path / "straight")


def test_a_language_model_under_torchrun_matches_one_process_accumulating(tmp_path):
    """LM epochs are drawn lazily (batch k of an epoch on demand); each rank still counts the whole
    global batch's tokens."""
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question. " * 40)
    config = tmp_path / "lm.yaml"
    config.write_text(f"""\
model: {{arch: decoder_lm, stack: {{d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64, dropout: 0.0}}}}
data: {{format: text, train: {text}, text: {{tokenizer: char}}, block_size: 16}}
train: {{max_steps: 4, batch_size: 4, lr_schedule: constant, lr: 0.003, warmup_steps: 1, eval_every: 4,
        progress: false}}
""")
    train_under_torchrun_and_accumulating(config, tmp_path)


def test_transformer_xl_on_random_windows_under_torchrun_matches_one_process_accumulating(tmp_path):
    """Each window builds its own memory from its context segment, so a rank needs no batch that
    another rank read (in the rows layout each rank would start from an empty memory)."""
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question. " * 40)
    config = tmp_path / "xl.yaml"
    config.write_text(f"""\
model: {{arch: transformer_xl, stack: {{d_model: 32, n_heads: 2, n_layers: 2, d_ff: 64, dropout: 0.0, norm: pre}},
        memory_length: 8}}
data: {{task: segment_language_model, train: {text}, text: {{tokenizer: char}}, block_size: 8, context_segments: 1}}
train: {{max_steps: 4, batch_size: 4, lr_schedule: constant, lr: 0.003, warmup_steps: 1, eval_every: 4,
        progress: false}}
""")
    train_under_torchrun_and_accumulating(config, tmp_path)


def test_exit_worker_flushes_its_output_keeps_the_status_and_skips_the_shutdown():
    script = (
        "import atexit, sys\n"
        "from attnlab.parallel.distributed import exit_worker\n"
        "atexit.register(print, 'shutdown ran')\n"
        "print('report')\n"  # block-buffered: stdout is a pipe
        "print('note', file=sys.stderr)\n"
        "exit_worker(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV)
    assert (done.returncode, done.stdout, done.stderr) == (3, "report\n", "note\n")


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_the_cli_ends_a_torchrun_worker_with_the_errors_status_and_its_one_line(tmp_path, world_size):
    """Under torchrun (WORLD_SIZE > 1) main ends the process itself, so the interpreter's shutdown
    (here, an atexit handler) does not run; a single process shuts down as usual."""
    missing = tmp_path / "missing.yaml"
    script = (
        "import atexit, sys\n"
        "from attnlab.cli import main\n"
        "atexit.register(print, 'shutdown ran')\n"
        f"sys.exit(main(['train', {str(missing)!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**ENV, "WORLD_SIZE": world_size, "RANK": "0"},
    )
    shutdown = "shutdown ran\n" if world_size == "1" else ""
    assert (done.returncode, done.stdout, done.stderr) == (3, shutdown, f"error: {missing}: no such config file\n")


def test_fsdp_trains_as_one_process_does_and_resumes_only_under_fsdp(tmp_path):
    """train.strategy fsdp: FSDP2's fully_shard on gloo, each rank holding half of every layer. The
    losses are one process's (accumulating the same global batch) to rounding; the checkpoint is
    the usual weights file; the gathered optimizer state resumes under fsdp, and is refused in one
    line without it."""
    config = tmp_path / "tiny.yaml"
    config.write_text("""\
model: {stack: {d_model: 32, n_heads: 2, n_layers: 2, d_ff: 64, dropout: 0.0}}
data: {format: builtin, generator: {name: reverse}, text: {tokenizer: word}, n_train: 300, n_valid: 20, n_test: 20}
train: {max_steps: 6, max_tokens: 200, lr_schedule: constant, lr: 0.002, warmup_steps: 2, eval_every: 3,
        log_every: 1, progress: false, eval_exact_match: 5}
""")
    fsdp = torchrun(
        "-m", "attnlab.cli", "train", str(config), "--out", str(tmp_path / "fsdp"), "--set", "train.strategy=fsdp"
    )
    assert fsdp.returncode == 0, why(fsdp)
    single = subprocess.run(
        [*ATTNLAB, "train", str(config), "--out", str(tmp_path / "single"), "--set", "train.accumulate=2"],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert single.returncode == 0, why(single)

    def logged(run: Path) -> list[tuple[int, str, float]]:
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["split"], r.get("loss", r.get("valid_loss"))) for r in lines]

    sharded, one = logged(tmp_path / "fsdp"), logged(tmp_path / "single")
    assert [r[:2] for r in sharded] == [r[:2] for r in one] and len(sharded) == 8  # 6 train lines, 2 valid
    assert [r[2] for r in sharded] == pytest.approx([r[2] for r in one], rel=1e-5)
    assert (
        load_run(tmp_path / "fsdp", "last")[0].state_dict().keys()
        == load_run(tmp_path / "single", "last")[0].state_dict().keys()
    )
    resumed = torchrun(
        "-m",
        "attnlab.cli",
        "train",
        "--out",
        str(tmp_path / "fsdp"),
        "--resume",
        "--allow-changes",
        "--set",
        "train.max_steps=8",
    )
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, why(resumed)
    assert [r[0] for r in logged(tmp_path / "fsdp") if r[1] == "train"] == list(range(1, 9))
    alone = subprocess.run(
        [
            *ATTNLAB,
            "train",
            "--out",
            str(tmp_path / "fsdp"),
            "--resume",
            "--allow-changes",
            "--set",
            "train.max_steps=10",
            "--set",
            "train.strategy=ddp",
        ],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert alone.returncode == 5 and alone.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "trained with train.strategy fsdp under torchrun" in alone.stderr
