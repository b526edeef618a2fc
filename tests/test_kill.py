"""SIGKILL at random moments and inside checkpoint writes: every time, the newest complete
checkpoint loads and --resume continues from it; the final weights equal those of a run that was
never interrupted (same seed). The TensorBoard events of every checkpointed step survive a kill."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
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
data: {{format: builtin, generator: {{name: reverse}}, text: {{tokenizer: word}}, n_train: 400, n_valid: 20, n_test: 20}}
train: {{max_steps: {STEPS}, max_tokens: 300, lr_schedule: constant, lr: 0.001, warmup_steps: 5, eval_every: 1,
        keep_last: 2, log_every: 5, progress: false, seed: 3}}
""")
    return config


# `attnlab train ARGS` that pauses inside its N-th checkpoint write, after the weights and the training
# state and before meta.json and the checksums, says so on stdout and waits there for the test's SIGKILL.
PAUSING_IN_A_WRITE = """\
import sys, threading
from pathlib import Path
import torch
from attnlab.cli import main
from attnlab.files import is_leftover

pause_at, writes, save = int(sys.argv[1]), 0, torch.save

def save_then_pause(obj, path, *args, **kwargs):
    global writes
    save(obj, path, *args, **kwargs)
    if is_leftover(Path(path).parent):  # into a checkpoint's staging directory
        writes += 1
        if writes == pause_at:
            print("paused in a checkpoint write", flush=True)
            threading.Event().wait()

torch.save = save_then_pause
sys.exit(main(sys.argv[2:]))
"""


def train(config: Path, out: Path, resume: bool, pause_in_write: int | None = None) -> subprocess.Popen:
    """`attnlab train`; with ``pause_in_write`` = N, paused inside its N-th checkpoint write (stdout says when)."""
    args = ["train", str(config), "--out", str(out)] + (["--resume"] if resume else [])
    command = (
        [*ATTNLAB, *args]
        if pause_in_write is None
        else [sys.executable, "-c", PAUSING_IN_A_WRITE, str(pause_in_write), *args]
    )
    return subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL if pause_in_write is None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def paused_in_a_write(process: subprocess.Popen) -> bool:
    """Whether ``process`` (started with ``pause_in_write``) paused in its write; False: it ended first."""
    if any(line == "paused in a checkpoint write\n" for line in process.stdout):
        return True
    process.wait()
    return False


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
    kills, finished = 0, []
    while kills < 6:  # three at random moments, three inside a checkpoint write
        in_write = kills % 2 == 1
        if in_write:  # paused in one of the checkpoint writes still to come, and killed there
            remaining = STEPS - (run.steps() or [0])[-1]  # writes to come, a checkpoint at every step (none: it ends)
            pause_at = rng.randint(1, max(1, remaining))
            process = train(config, run.path, resume=run.config.exists(), pause_in_write=pause_at)
            assert paused_in_a_write(process) or remaining == 0, "no checkpoint write went through torch.save"
        else:
            process = train(config, run.path, resume=run.config.exists())
            time.sleep(rng.uniform(0.1, duration))
        code = process.poll()
        if code is not None and code != -signal.SIGKILL:  # it ended before the kill: check it, start another run
            assert code == 0, process.stderr.read()
            finished.append(run.path)
            run = RunDir(tmp_path / f"killed-{len(finished)}")
            continue
        process.kill()  # SIGKILL: no handler, no cleanup
        process.wait()
        kills += 1
        if in_write:  # the checkpoint being written is half there, unpublished
            assert sorted(p.name for p in run.checkpoints.glob(".*.tmp/*")) == ["model.safetensors", "trainer_state.pt"]
        if run.steps():
            load_run(run.path, "last")  # the newest complete checkpoint always loads
    done = train(config, run.path, resume=run.config.exists())
    assert done.wait() == 0, done.stderr.read()
    assert not list(run.checkpoints.glob(".*.tmp"))  # half-written checkpoints were cleaned up
    for path in [*finished, run.path]:
        for name, tensor in final_weights(path).items():
            assert torch.equal(tensor, expected[name]), f"{path.name}: {name}"


def test_a_killed_run_keeps_the_tensorboard_events_of_its_checkpoints(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tmp_path / "long.yaml"
    config.write_text("""\
model: {stack: {d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64, dropout: 0.0}}
data: {format: builtin, generator: {name: reverse}, text: {tokenizer: word}, n_train: 200, n_valid: 10, n_test: 10}
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
    assert len(saved) >= 3, process.stderr.read()
    events = EventAccumulator(str(run.tensorboard))
    events.Reload()
    logged = {e.step for e in events.Scalars("valid/valid_loss")}
    assert set(saved) <= logged, (saved, sorted(logged))  # the writer hands each event to the file as it comes
