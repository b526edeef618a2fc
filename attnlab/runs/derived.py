"""Checkpoints made from a run's own: the average of its last checkpoints (`attnlab average`,
checkpoints/average/) and a run exported for decoding with bf16 or int8 weights (`attnlab export`:
the run's model files and one checkpoint, step-N, without a training state). Both are written
atomically (a staging folder, then one rename) with runs/checkpoint_files.py's write_checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.decode.weights import stored_state, with_weights
from attnlab.errors import CheckpointError, UsageError
from attnlab.files import publish_dir, staging_dir
from attnlab.runs.checkpoint import build_run_model, checkpoint_file
from attnlab.runs.checkpoint_files import META_FILE, MODEL_FILE, write_checkpoint
from attnlab.runs.run_dir import RunDir
from attnlab.runs.weights_file import load_weights, verify_checksum


def average_checkpoints(model: nn.Module, paths: list[Path]) -> nn.Module:
    """Set ``model``'s weights to the mean of the given safetensors checkpoints (Vaswani et al.
    average the last 5 or 20 checkpoints for their results)."""
    total: dict[str, torch.Tensor] = {}
    for path in paths:
        load_weights(model, path)
        for name, tensor in model.state_dict().items():
            total[name] = total.get(name, 0) + tensor.double()
    model.load_state_dict({name: (t / len(paths)).to(model.state_dict()[name].dtype) for name, t in total.items()})
    return model


def write_average(path: str | Path, last: int, force: bool = False) -> tuple[Path, list[int]]:
    """Average the newest ``last`` checkpoints of a run into checkpoints/average/ (atomically); an
    existing average is replaced only with ``force``. (An older best checkpoint, kept by pruning,
    is among them only if ``last`` exceeds keep_last.)"""
    if last < 1:
        raise UsageError(f"--last must be at least 1 (got {last})")
    run = RunDir(path)
    model_cfg, _, _ = run.read_config()  # a folder that is not a run says so, as in every command
    final = run.checkpoints / "average"
    if final.exists() and not force:
        raise UsageError(f"{final} already exists; pass --force to replace it")
    steps = run.steps()[-last:]
    if not steps:
        raise CheckpointError(f"{run.path}: no checkpoint to average")
    model = average_checkpoints(
        build_run_model(run, model_cfg, run.read_shape()), [run.step_dir(s) / MODEL_FILE for s in steps]
    )
    staged = staging_dir(final)
    write_checkpoint(staged, model.state_dict(), {"averaged_steps": steps})
    publish_dir(staged, final)
    return final, steps


def export_run(
    path: str | Path, out: str | Path, weights: str, checkpoint: str = "best", force: bool = False
) -> tuple[Path, Path]:
    """Write ``checkpoint`` of run ``path`` with ``weights`` (bf16 or int8) as a new run directory
    ``out``, for decoding (atomically; an existing ``out`` is replaced only with ``force``): the run's
    :meth:`RunDir.model_files` and one checkpoint, step-N (the source's step; an average's newest),
    whose meta.json adds where it came from. Returns the exported weights file and the source's."""
    run, final = RunDir(path), Path(out)
    if final.exists() and not force:
        raise UsageError(f"{final} already exists; pass --force to replace it")
    if final.resolve() in (run.path.resolve(), *run.path.resolve().parents):
        raise UsageError(f"--out {final} holds the run {run.path} itself; choose another")
    model_cfg, _, _ = run.read_config()
    source = checkpoint_file(run, checkpoint)
    model = build_run_model(run, model_cfg, run.read_shape()).eval()
    load_weights(model, source)
    try:
        with_weights(model, weights)
    except ValueError as err:
        raise UsageError(f"--weights {weights}: {err}") from None
    meta = _meta_with_step(source.parent) | {
        "exported": {"run": str(run.path), "checkpoint": checkpoint, "weights": weights}
    }
    staged = staging_dir(final)
    for file in run.model_files():
        shutil.copyfile(file, staged / file.name)
    directory = RunDir(staged).step_dir(meta["step"])
    directory.mkdir(parents=True)
    write_checkpoint(directory, stored_state(model), meta, kind=weights)
    publish_dir(staged, final)
    return RunDir(final).step_dir(meta["step"]) / MODEL_FILE, source


def _meta_with_step(directory: Path) -> dict[str, Any]:
    """A checkpoint's meta.json, after its checksum, with its step (an average's: its newest step)."""
    path = directory / META_FILE
    verify_checksum(path)
    try:
        meta = json.loads(path.read_text())
        return meta | {"step": meta["step"] if "step" in meta else meta["averaged_steps"][-1]}
    except (OSError, UnicodeDecodeError, ValueError, LookupError, TypeError) as err:
        raise CheckpointError(f"{path}: cannot read ({err!r})") from None
