"""The run directories of tests/fixtures/runs_f01/: two 2-step tiny runs written by the code of the day
the model section was still flat (issue 61: configs by composition), and what they decode and how
they resume, so that tests/test_runs_f01.py can check that later releases read them identically.

- ``encoder_decoder``: the Transformer on the built-in reversal task (word tokenizer);
- ``vit``: a ViT on the built-in digits (8x8 images, 10 classes).

For each run, ``expected.json`` records, from the best checkpoint: the greedy translation of fixed
sources (encoder_decoder) or the class probabilities of fixed images (vit), the logits' sum, and the
train loss of step 3 after resuming a copy of the run for one step (``--resume``, max_steps 3), with
the sum of its weights then. Only what later code needs to read is kept: config.yaml, the tokenizers,
the task's state, summary.json and the checkpoints (tensorboard logs are left out).

    .venv/bin/python docs/experiments/runs_f01_fixture.py tests/fixtures/runs_f01

The fixture was made at commit b183763, whose model section was flat; CONFIGS are in that layout
(patch_size, not patches: {size: ...}), so this script makes the fixture again only at that commit.
Later code reads the fixture through runs/migration.py; tests/test_runs_f01.py imports ``decoded``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from attnlab.cli import main
from attnlab.data.tokenizers import BOS
from attnlab.runs.checkpoint import load_run

CONFIGS = {
    "encoder_decoder": """\
model: {arch: encoder_decoder, max_len: 32, tie_embeddings: all,
        stack: {d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, dropout: 0.1}}
data: {format: builtin, generator: reverse, tokenizer: word, n_train: 200, n_valid: 20, n_test: 10,
       min_len: 3, max_len: 5}
train: {max_steps: 2, max_tokens: 60, lr_schedule: constant, lr: 0.01, warmup_steps: 0, eval_every: 2,
        log_every: 1, progress: false, keep_last: 1}
""",
    "vit": """\
model: {arch: vit, patch_size: 4, stack: {d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, dropout: 0.1}}
data: {task: image_classification, dataset: digits}
train: {max_steps: 2, batch_size: 16, optimizer: adamw, lr_schedule: constant, lr: 1.0e-2, warmup_steps: 1,
        eval_every: 2, log_every: 1, label_smoothing: 0.0, early_stop_metric: accuracy, progress: false,
        keep_last: 1}
""",
}
SOURCES = ["a b c", "d e f g"]  # reversal sources, in the generator's alphabet
KEEP = ("config.yaml", "summary.json", "task_state.json", "metrics.jsonl", "checkpoints")


def cli(*args: str, stdin: str = "") -> str:
    """`attnlab ARGS` in this process, reading ``stdin``; its stdout (a failure raises)."""
    out, err = io.StringIO(), io.StringIO()
    saved, sys.stdin = sys.stdin, io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        sys.stdin = saved
    if code != 0:
        raise SystemExit(f"attnlab {' '.join(args)} failed: {err.getvalue()}")
    return out.getvalue()


def fixed_images() -> torch.Tensor:
    """Three standardised-looking 8x8 images (B, 1, 8, 8) from a fixed generator."""
    return torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(61))


def decoded(run: Path) -> dict:
    """What the run's best checkpoint gives on the fixed inputs."""
    model, tokenizers, cfg = load_run(run)
    with torch.no_grad():
        if cfg.arch == "vit":
            logits = model.classify(fixed_images())
            return {"probabilities": logits.softmax(-1).tolist(), "logits_sum": logits.sum().item()}
        x = torch.tensor([tokenizers["src"].encode(SOURCES[0])])
        y = torch.tensor([[BOS, *tokenizers["tgt"].encode("c b a")]])
        logits = model(x, y)  # (1, 4, V): teacher-forced
    text = cli("translate", str(run), "--beam", "1", "--min-len", "3", stdin="\n".join(SOURCES) + "\n")
    return {"logits_sum": logits.sum().item(), "logits_first": logits[0, 0].tolist(), "translations": text}


def resumed(run: Path) -> dict:
    """A copy of the run resumed for one step: step 3's train loss and the weights' sum after it."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / run.name
        shutil.copytree(run, copy)
        cli("train", "--out", str(copy), "--resume", "--allow-changes", "--set", "train.max_steps=3")
        records = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
        loss = [r["loss"] for r in records if r.get("split") == "train" and r["step"] == 3]
        model, _, _ = load_run(copy, "last")
        return {"step3_loss": loss[0], "weights_sum_after": sum(p.double().sum().item() for p in model.parameters())}


def main_(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in CONFIGS.items():
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / f"{name}.yaml"
            config.write_text(text)
            run = Path(tmp) / "run"
            torch.manual_seed(0)
            cli("train", str(config), "--out", str(run))
            target = out / name
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            for item in run.iterdir():
                if item.name in KEEP or item.name.startswith("tokenizer"):
                    (shutil.copytree if item.is_dir() else shutil.copy2)(item, target / item.name)
        expected = {"decoded": decoded(target), "resumed": resumed(target)}
        (out / f"{name}.expected.json").write_text(json.dumps(expected, indent=1) + "\n")
        print(name, json.dumps(expected)[:200])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    main_(parser.parse_args().out)
