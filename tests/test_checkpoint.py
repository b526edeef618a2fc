"""Checkpoints on a disk that fills up (issue 37, item 10): a writer that fails at the second
checkpoint, as a full tmpfs made safetensors and torch.save fail, ends `attnlab train` in one line
(what could not be written, where, the space it needed, the last good checkpoint, the resume
command) with CheckpointError's exit code; the partial checkpoint is gone, the first one is intact
and the run resumes from it."""

from __future__ import annotations

import errno
import json
import re
import resource
import signal
import subprocess
from pathlib import Path

import pytest
import torch

import attnlab.runs.weights_file as weights_file
from attnlab.errors import CheckpointError
from attnlab.runs.checkpoint import load_run
from attnlab.runs.run_dir import RunDir

from helpers import ATTNLAB, run_cli

FULL = OSError(errno.ENOSPC, "No space left on device")
# what torch.save's zip writer raised on the full 3 MB tmpfs
TORCH_FULL = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 291584 vs 291476")


def write_config(root: Path) -> Path:
    config = root / "tiny.yaml"
    config.write_text("""\
model: {stack: {d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, dropout: 0.0}}
data: {format: builtin, generator: {name: copy, min_len: 3, max_len: 5}, text: {tokenizer: word}, n_train: 60, n_valid: 10, n_test: 10}
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


@pytest.mark.parametrize(
    "writer,error,reason",
    [
        ("model.safetensors", FULL, "model.safetensors: No space left on device"),
        ("trainer_state.pt", FULL, "trainer_state.pt: No space left on device"),
        ("trainer_state.pt", TORCH_FULL, "trainer_state.pt: unexpected pos 291584 vs 291476"),
        ("meta.json", FULL, "meta.json: No space left on device"),
    ],
)
def test_a_full_disk_at_the_second_checkpoint_ends_in_one_line_and_the_first_resumes(
    tmp_path, monkeypatch, writer, error, reason
):
    out = tmp_path / "run"
    if writer == "model.safetensors":
        monkeypatch.setattr(weights_file, "save_file", fails_the_second_time(weights_file.save_file, error))
    elif writer == "trainer_state.pt":
        monkeypatch.setattr(torch, "save", fails_the_second_time(torch.save, error))
    else:  # Path.write_text, as (path, text): the second meta.json
        failing = fails_the_second_time(lambda text, path: WRITE_TEXT(path, text), error)
        monkeypatch.setattr(
            Path,
            "write_text",
            lambda path, text, **kwargs: (
                failing(text, path) if path.name == "meta.json" else WRITE_TEXT(path, text, **kwargs)
            ),
        )
    done = run_cli("train", str(write_config(tmp_path)), "--out", str(out))
    monkeypatch.undo()

    run = RunDir(out)
    assert done.returncode == CheckpointError.exit_code == 5
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    line = done.stderr.strip()
    pattern = (
        rf"error: could not write checkpoint {re.escape(str(run.step_dir(4)))} \({re.escape(reason)}; it needs "
        rf"about [\d.]+ kB, [\d.]+ [kMG]B free\); the last good checkpoint is step 2: free some space, then "
        rf"continue with `attnlab train --out {re.escape(str(out))} --resume`"
    )
    assert re.fullmatch(pattern, line), line
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["best.json", "step-000002"]  # no .step-000004.*.tmp
    assert run.steps() == [2] and run.best_step() == 2
    load_run(out, "last")  # the first checkpoint is intact: its checksums pass, its weights load
    resumed = run_cli("train", "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stdout + resumed.stderr and run.steps() == [2, 4]


def test_the_space_a_checkpoint_needs_counts_each_storage_once():
    from attnlab.runs.checkpoint_files import amount, checkpoint_bytes

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
    assert done.stderr.strip().endswith(
        f"no checkpoint was written before it: free some space, then `attnlab train "
        f"--out {out} --resume` starts it again from step 0"
    )
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
    done = subprocess.run(
        [*ATTNLAB, "train", str(write_config(tmp_path)), "--out", str(out)],
        capture_output=True,
        text=True,
        preexec_fn=limited,
    )
    assert done.returncode == 5 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith(
        f"error: could not write checkpoint {RunDir(out).step_dir(2)} (trainer_state.pt: unexpected pos "
    )
    assert not list(RunDir(out).checkpoints.iterdir())
    assert run_cli("train", "--out", str(out), "--resume").returncode == 0 and RunDir(out).steps() == [2, 4]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("damaged", ["model.safetensors", "trainer_state.pt"])
def test_a_refused_resume_changes_no_byte_of_the_run_and_names_the_intact_checkpoint(tmp_path, damaged):
    """Issue 64, item 1: resuming with --allow-changes from a damaged newest checkpoint rewrote
    config.yaml and appended to config_changes.jsonl before the checksum refused it. Now the refusal
    comes first, names the newest intact checkpoint and the command that resumes from it; that
    command sets the newer checkpoints aside (kept), points best.json at a checkpoint it keeps,
    records the changes at the step it resumed from, and logs each step once."""
    out = tmp_path / "run"
    assert run_cli("train", str(write_config(tmp_path)), "--out", str(out)).returncode == 0
    run = RunDir(out)
    assert run.steps() == [2, 4] and run.best_step() in (2, 4)
    file = run.step_dir(4) / damaged
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))
    before = snapshot(out)

    refused = run_cli("train", "--out", str(out), "--resume", "--allow-changes", "--set", "train.max_steps=6")
    assert refused.returncode == CheckpointError.exit_code, refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith(f"error: {file}: sha256 ")
    assert refused.stderr.strip().endswith(
        f"; the newest intact checkpoint before it is step 2 ({run.step_dir(2)}): resume from it with `attnlab "
        f"train --out {out} --resume-from 2` (the newer checkpoints are set aside, not deleted)"
    )
    assert snapshot(out) == before  # config.yaml, config_changes.jsonl, metrics.jsonl, TensorBoard: untouched

    resumed = run_cli("train", "--out", str(out), "--resume-from", "2", "--allow-changes", "--set", "train.max_steps=6")
    assert resumed.returncode == 0, resumed.stderr
    aside = [p for p in run.checkpoints.iterdir() if p.name.startswith("set-aside-")]
    assert (
        len(aside) == 1
        and (aside[0] / "step-000004" / damaged).read_bytes() == before[f"checkpoints/step-000004/{damaged}"]
    )
    assert run.steps() == [2, 4, 6] and run.intact(4) and run.best_step() in run.steps()
    changes = [json.loads(line) for line in run.config_changes.read_text().splitlines()]
    assert [(c["step"], c["changes"]) for c in changes] == [(2, ["train.max_steps: 4 -> 6"])]
    logged = [(r["step"], r["split"]) for r in map(json.loads, run.metrics.read_text().splitlines())]
    assert logged == sorted(set(logged), key=logged.index)  # no step logged twice
    assert [s for s, split in logged if split == "valid"] == [2, 4, 6]


def test_resume_from_a_step_the_run_does_not_have_is_refused_in_one_line(tmp_path):
    out = tmp_path / "run"
    assert run_cli("train", str(write_config(tmp_path)), "--out", str(out)).returncode == 0
    before = snapshot(out)
    refused = run_cli("train", "--out", str(out), "--resume-from", "3")
    assert refused.returncode == CheckpointError.exit_code and refused.stderr.count("\n") == 1
    assert refused.stderr == f"error: --resume-from: {out} has no checkpoint of step 3 (it has 2, 4)\n"
    assert snapshot(out) == before
