"""SIGKILL at random moments, checkpoint writes included: every time, the newest complete
checkpoint loads and --resume continues from it; the final weights equal those of a run that was
never interrupted (same seed). The TensorBoard events of every checkpointed step survive a kill."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import torch

from attnlab.runs.checkpoint import load_run
from attnlab.runs.run_dir import RunDir
from helpers import ATTNLAB

STEPS = 40


def write_config(root: Path) -> Path:
    """A reverse-the-digits task with dropout (the RNG state must survive a kill) and a checkpoint
    at every step, big enough that writing it takes a good part of each step."""
    config = root / "kill.yaml"
    config.write_text(f"""\
model: {{stack: {{d_model: 128, n_heads: 4, n_layers: 2, d_ff: 512, dropout: 0.1}}}}
data: {{format: builtin, generator: reverse, tokenizer: word, n_train: 400, n_valid: 20, n_test: 20}}
train: {{max_steps: {STEPS}, max_tokens: 300, lr_schedule: constant, lr: 0.001, warmup_steps: 5, eval_every: 1,
        keep_last: 2, log_every: 5, progress: false, seed: 3}}
""")
    return config


def train(config: Path, out: Path, resume: bool) -> subprocess.Popen:
    args = [*ATTNLAB, "train", str(config), "--out", str(out)] + (["--resume"] if resume else [])
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def kill_in_a_write(process: subprocess.Popen, run: RunDir, timeout: float) -> None:
    """SIGKILL the moment a checkpoint is being written (its staging directory exists)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline and process.poll() is None:
        if run.checkpoints.exists() and any(run.checkpoints.glob(".*.tmp")):
            break
        time.sleep(0.001)
    process.kill()


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    assert RunDir(run_dir).steps()[-1] == STEPS
    return load_run(run_dir, "last")[0].state_dict()


def test_sigkill_at_six_moments_then_resume_gives_the_uninterrupted_weights(tmp_path):
    config = write_config(tmp_path)
    reference = tmp_path / "reference"
    started = time.perf_counter()
    assert train(config, reference, resume=False).wait() == 0
    duration = time.perf_counter() - started
    expected = final_weights(reference)
    run = RunDir(tmp_path / "killed-0")
    rng = random.Random(0)
    kills, mid_write, finished = 0, 0, []
    while kills < 6:  # three at random moments, three inside a checkpoint write
        process = train(config, run.path, resume=run.config.exists())
        if kills % 2:  # every other kill waits for a checkpoint write and lands inside it
            kill_in_a_write(process, run, duration)
        else:  # the others at a random moment
            time.sleep(rng.uniform(0.1, duration))
        code = process.poll()
        if code is not None and code != -signal.SIGKILL:  # it ended before the kill: check it, start another run
            assert code == 0, process.stderr.read().decode()
            finished.append(run.path)
            run = RunDir(tmp_path / f"killed-{len(finished)}")
            continue
        process.kill()  # SIGKILL: no handler, no cleanup
        process.wait()
        kills += 1
        mid_write += any(run.checkpoints.glob(".*.tmp")) if run.checkpoints.exists() else 0
        if run.steps():
            load_run(run.path, "last")  # the newest complete checkpoint always loads
    done = train(config, run.path, resume=run.config.exists())
    assert done.wait() == 0, done.stderr.read().decode()
    assert not list(run.checkpoints.glob(".*.tmp"))  # half-written checkpoints were cleaned up
    for path in [*finished, run.path]:
        for name, tensor in final_weights(path).items():
            assert torch.equal(tensor, expected[name]), f"{path.name}: {name}"
    assert mid_write >= 1, "no kill landed in a checkpoint write; the test did not test that"


def test_a_killed_run_keeps_the_tensorboard_events_of_its_checkpoints(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tmp_path / "long.yaml"
    config.write_text("""\
model: {stack: {d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64, dropout: 0.0}}
data: {format: builtin, generator: reverse, tokenizer: word, n_train: 200, n_valid: 10, n_test: 10}
train: {max_steps: 100000, max_tokens: 200, eval_every: 1, keep_last: 100000, log_every: 1000, progress: false}
""")
    run = RunDir(tmp_path / "run")
    process = train(config, run.path, resume=False)
    deadline = time.perf_counter() + 120
    while len(run.steps()) < 3 and time.perf_counter() < deadline and process.poll() is None:
        time.sleep(0.05)
    process.kill()
    process.wait()
    saved = run.steps()
    assert len(saved) >= 3, process.stderr.read().decode()
    events = EventAccumulator(str(run.tensorboard))
    events.Reload()
    logged = {e.step for e in events.Scalars("valid/valid_loss")}
    assert set(saved) <= logged, (saved, sorted(logged))  # the writer hands each event to the file as it comes
