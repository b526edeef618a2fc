"""``attnlab prune``: rank a trained model's heads by importance and cut the least important.

Importance is Michel et al.'s (2019) |dL/d xi_h| on the run's validation split (the task's loss
without label smoothing, per target: token, masked token or example), normalised per layer; heads
are pruned globally, least important first, never the last head of a layer. Each fraction is
evaluated with the heads gated to zero on the same split by the task's own metrics (loss; accuracy
and macro-F1 for a classifier), and greedy decoding for BLEU / exact match; with ``out`` and one
fraction, the heads are then removed from the weights and written as a new run directory that
``translate``, ``evaluate`` and ``inspect`` load like any other.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from attnlab.analysis.heads import head_importance, heads_to_prune, mask_heads
from attnlab.decode.spec import Greedy
from attnlab.decode.weights import weights_of
from attnlab.errors import UsageError
from attnlab.eval.evaluate import evaluate as evaluate_text
from attnlab.files import publish_dir, staging_dir
from attnlab.nn.attention import remove_heads
from attnlab.runs.checkpoint import load_run
from attnlab.runs.checkpoint_files import write_checkpoint
from attnlab.runs.data import read_run_data
from attnlab.runs.run_dir import RunDir
from attnlab.runs.weights_file import exported_weights
from attnlab.tasks import Task, TaskData
from attnlab.tasks.translation import Seq2SeqData


def mean_loss(task: Task[Any, Any]) -> Callable[[nn.Module, Any], torch.Tensor]:
    """The task's loss per target of a batch, without label smoothing: what importance differentiates."""
    return lambda model, batch: task.loss(model, batch, 0.0, contextlib.nullcontext)[1] / batch.n_targets


def _metrics(
    model: nn.Module, task: Task[Any, Any], data: TaskData, split: str, limit: int | None, progress: bool
) -> dict[str, float]:
    result = task.validate(model, data, next(model.parameters()).device, contextlib.nullcontext, 0, split)
    if isinstance(data, Seq2SeqData):
        examples = data.splits[split][:limit]
        text = evaluate_text(
            model, data.tokenizers, [e.src for e in examples], [e.tgt for e in examples], Greedy(), progress=progress
        )
        result |= {"bleu": text["bleu"], "exact_match": text["exact_match"], "sentences": len(examples)}
    return result


def prune_run(
    run_dir: str | Path,
    fractions: list[float],
    split: str = "valid",
    out: str | Path | None = None,
    limit: int | None = None,
    log: Callable[[str], None] | None = None,
    device: torch.device | str = "cpu",
    text: str | None = None,
) -> dict[str, Any]:
    """Rank the heads of ``run_dir``'s model, then measure it with no heads pruned and with each of
    ``fractions`` pruned: {"run", "split", "importance", "results": one entry per measurement}, and
    "out" when the pruned model was written there. ``log`` hears one line when the ranking is done
    and one per measurement, with its time; with it, decoding also shows its progress bar. ``text``: a
    file to rank and measure on instead of the run's data (read_run_data)."""
    if out is not None and len(fractions) != 1:
        raise UsageError("--out writes one pruned model: give one --fraction")
    if out is not None and Path(out).exists():
        raise UsageError(f"{out} already exists; choose another --out")
    for f in fractions:
        if not 0.0 <= f < 1.0:
            raise UsageError(f"--fraction must be in [0, 1) (got {f})")
    run = RunDir(run_dir)
    model, _, _ = load_run(run_dir, device=device)
    if (kind := weights_of(model)) != "fp32":  # ranking heads needs gradients, which quantised weights have not
        raise exported_weights(run.path, kind)
    task = run.read_config()[1].task
    data = read_run_data(run, split, text)
    say = log or (lambda line: None)
    started = time.perf_counter()
    importance = head_importance(model, [b.to(device) for b in data.eval_batches(split)], mean_loss(task))
    n_heads = sum(len(v) for v in importance.values())
    say(f"ranked {n_heads} heads by importance on {split} in {time.perf_counter() - started:.1f} s")
    results: list[dict[str, Any]] = []
    for k, fraction in enumerate([0.0, *fractions], 1):
        started = time.perf_counter()
        heads = heads_to_prune(importance, fraction)
        mask_heads(model, heads)
        pruned = sum(len(v) for v in heads.values())
        results.append(
            {
                "fraction": fraction,
                "heads_pruned": pruned,
                "heads_total": n_heads,
                "pruned": heads,
                **_metrics(model, task, data, split, limit, progress=log is not None),
            }
        )
        say(
            f"[{k}/{len(fractions) + 1}] measured {split} with {pruned}/{n_heads} heads pruned ({fraction:.0%}) "
            f"in {time.perf_counter() - started:.1f} s"
        )
    mask_heads(model, {})
    summary = {
        "run": str(run_dir),
        "split": split,
        "importance": {name: [round(float(x), 4) for x in imp] for name, imp in importance.items()},
        "results": results,
    }
    if out is not None:
        remove_heads(model, results[-1]["pruned"])
        _write_pruned_run(run, model, results[-1], Path(out))
        summary["out"] = str(out)
    return summary


def _write_pruned_run(run: RunDir, model: nn.Module, result: dict[str, Any], out: Path) -> None:
    """A run directory holding the pruned weights as its only (and best) checkpoint."""
    staged = staging_dir(out)
    for path in (*run.model_files(), run.init):  # config.yaml, shape.json, the tokenizers, the task's state
        if path.exists() and path != run.pruned_heads:  # the heads pruned now are written below
            shutil.copy2(path, staged / path.name)
    new = RunDir(staged)
    new.pruned_heads.write_text(json.dumps(result["pruned"], indent=2))
    step = run.best_step() or run.steps()[-1]
    step_dir = new.step_dir(step)
    step_dir.mkdir(parents=True)
    write_checkpoint(
        step_dir,
        model.state_dict(),
        {"step": step, "pruned_from": str(run.path), **{k: v for k, v in result.items() if k != "pruned"}},
    )
    new.best_pointer.write_text(json.dumps({"step": step, "metric": "pruned", "value": result["fraction"]}))
    publish_dir(staged, out)
