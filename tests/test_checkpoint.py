"""Checkpoints on a disk that fills up (issue 37, item 10): a writer that fails at the second
checkpoint, as a full tmpfs made safetensors and torch.save fail, ends `attnlab train` in one line
(what could not be written, where, the space it needed, the last good checkpoint, the resume
command) with CheckpointError's exit code; the partial checkpoint is gone, the first one is intact
and the run resumes from it."""

from __future__ import annotations

import errno
import re
import resource
import signal
import subprocess
from pathlib import Path

import pytest
import torch

import attnlab.train.weights_file as weights_file
from attnlab.errors import CheckpointError
from attnlab.train.checkpoint import RunDir, load_run
from helpers import ATTNLAB, run_cli

FULL = OSError(errno.ENOSPC, "No space left on device")
# what torch.save's zip writer raised on the full 3 MB tmpfs
TORCH_FULL = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 291584 vs 291476")


def write_config(root: Path) -> Path:
    config = root / "tiny.yaml"
    config.write_text("""\
model: {stack: {d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, dropout: 0.0}}
data: {format: builtin, generator: copy, tokenizer: word, n_train: 60, n_valid: 10, n_test: 10, min_len: 3, max_len: 5}
train: {max_steps: 4, max_tokens: 128, lr_schedule: constant, lr: 0.001, warmup_steps: 1, eval_every: 2,
        progress: false}
""")
    return config


def fails_the_second_time(write, error: BaseException):
    """``write``, but its second call writes a few bytes of its file and raises ``error``, as a
    disk that fills up halfway through a checkpoint."""
    calls = []

    def failing(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            Path(path).write_bytes(b"\0" * 100)
            raise error
        return write(obj, path, *args, **kwargs)

    return failing


WRITE_TEXT = Path.write_text


@pytest.mark.parametrize("writer,error,reason", [
    ("model.safetensors", FULL, "model.safetensors: No space left on device"),
    ("trainer_state.pt", FULL, "trainer_state.pt: No space left on device"),
    ("trainer_state.pt", TORCH_FULL, "trainer_state.pt: unexpected pos 291584 vs 291476"),
    ("meta.json", FULL, "meta.json: No space left on device"),
])
def test_a_full_disk_at_the_second_checkpoint_ends_in_one_line_and_the_first_resumes(
        tmp_path, monkeypatch, writer, error, reason):
    out = tmp_path / "run"
    if writer == "model.safetensors":
        monkeypatch.setattr(weights_file, "save_file", fails_the_second_time(weights_file.save_file, error))
    elif writer == "trainer_state.pt":
        monkeypatch.setattr(torch, "save", fails_the_second_time(torch.save, error))
    else:  # Path.write_text, as (path, text): the second meta.json
        failing = fails_the_second_time(lambda text, path: WRITE_TEXT(path, text), error)
        monkeypatch.setattr(Path, "write_text", lambda path, text, **kwargs: (
            failing(text, path) if path.name == "meta.json" else WRITE_TEXT(path, text, **kwargs)))
    done = run_cli("train", str(write_config(tmp_path)), "--out", str(out))
    monkeypatch.undo()

    run = RunDir(out)
    assert done.returncode == CheckpointError.exit_code == 5
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    line = done.stderr.strip()
    pattern = (rf"error: could not write checkpoint {re.escape(str(run.step_dir(4)))} \({re.escape(reason)}; it needs "
               rf"about [\d.]+ kB, [\d.]+ [kMG]B free\); the last good checkpoint is step 2: free some space, then "
               rf"continue with `attnlab train --out {re.escape(str(out))} --resume`")
    assert re.fullmatch(pattern, line), line
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["best.json", "step-000002"]  # no .step-000004.*.tmp
    assert run.steps() == [2] and run.best_step() == 2
    load_run(out, "last")  # the first checkpoint is intact: its checksums pass, its weights load
    resumed = run_cli("train", "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stdout + resumed.stderr and run.steps() == [2, 4]


def test_the_space_a_checkpoint_needs_counts_each_storage_once():
    from attnlab.train.run_dir import amount, checkpoint_bytes

    shared = torch.zeros(1000)  # 4,000 bytes, tied: stored once
    state = {"optimizer": {"state": {0: {"exp_avg": torch.zeros(10, dtype=torch.float64)}}, "lr": [0.1]}}
    assert checkpoint_bytes({"a": shared, "b": shared}, state) == 4000 + 80
    assert [amount(n) for n in (999, 291_584, 3_000_000, 2.5e9)] == ["999 bytes", "291.6 kB", "3.0 MB", "2.5 GB"]


def test_a_full_disk_before_the_first_checkpoint_says_training_starts_again(tmp_path, monkeypatch):
    out = tmp_path / "run"
    calls = []

    def full(obj, path, *args, **kwargs):
        calls.append(path)
        raise FULL

    monkeypatch.setattr(torch, "save", full)
    done = run_cli("train", str(write_config(tmp_path)), "--out", str(out))
    monkeypatch.undo()
    assert done.returncode == 5 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.strip().endswith(f"no checkpoint was written before it: free some space, then `attnlab train "
                                        f"--out {out} --resume` starts it again from step 0")
    assert not list(RunDir(out).checkpoints.iterdir())  # not even the staging folder
    assert run_cli("train", "--out", str(out), "--resume").returncode == 0


def test_a_process_whose_writes_fail_ends_in_one_line_without_a_traceback(tmp_path):
    """A real process on a file-size limit of 40 kB (the OS refuses writes beyond it, as a full disk
    does): torch.save's writer fails in the first checkpoint's trainer_state.pt with the very error
    the full tmpfs gave; the process prints one line, no traceback, and leaves no partial folder."""
    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))

    out = tmp_path / "run"
    done = subprocess.run([*ATTNLAB, "train", str(write_config(tmp_path)), "--out", str(out)], capture_output=True,
                          text=True, preexec_fn=limited)
    assert done.returncode == 5 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith(f"error: could not write checkpoint {RunDir(out).step_dir(2)} "
                                                f"(trainer_state.pt: unexpected pos ")
    assert not list(RunDir(out).checkpoints.iterdir())
    assert run_cli("train", "--out", str(out), "--resume").returncode == 0 and RunDir(out).steps() == [2, 4]
