"""A run directory's layout: a RunDir only reads and writes its files (runs/checkpoint.py builds and
loads a run's model from them); write_checkpoint writes one checkpoint's files. Nothing here
unpickles arbitrary objects.

    RUN_DIR/
      config.yaml                   the resolved config (model section with its vocabulary sizes)
      tokenizer-src.json            tokenizers, the library's own files, one per role the task
      tokenizer-tgt.json            saves (a language model has no src)
      task_state.json               what else the task keeps of its data (a classifier's labels)
      init.json                     only if it started from another run's weights (runs/init.py)
      checkpoints/step-000500/      one per save, the last `keep_last` kept (and the best)
        model.safetensors           weights (tied tensors stored once)
        trainer_state.pt            optimizer, schedule, step, data position, RNG states:
                                    tensors and plain Python values, loads with weights_only=True
        meta.json                   step and validation metrics
        checksums.json              sha256 of each file above, checked before anything is loaded
      checkpoints/best.json         {"step": N, "metric": ..., "value": ...}: which step is best
      metrics.jsonl                 one JSON object per log line (train and valid)
      tensorboard/                  the same scalars for TensorBoard
      summary.json                  the run's final figures
      pruned_heads.json             only after `attnlab prune`: the heads cut out of the weights

One checkpoint's files (their names, write_checkpoint, Checkpoint, its size on disk) are
runs/checkpoint_files.py's; the weights files themselves (safetensors, tied tensors stored once, the
kind of weights they hold, the checksums of a checkpoint directory) are runs/weights_file.py's.

A run exported for decoding (runs/derived.py's export_run) holds the files above that make its
model and tokenizers, and one checkpoint, checkpoints/step-N/ without trainer_state.pt, whose
model.safetensors holds bf16 or int8 weights (its metadata names the kind under "attnlab.weights"
and the layout under "attnlab.layout"). runs/checkpoint.py's load_run converts the freshly built
model to that kind before loading, so every command that reads runs reads it; training from it,
resuming it or averaging it is refused.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from attnlab.config import read_config_file
from attnlab.config_files import dump_yaml
from attnlab.data.tokenizers import Tokenizer
from attnlab.errors import CheckpointError, ConfigError
from attnlab.files import atomic_write_text, is_leftover, publish_dir, staging_dir
from attnlab.models import FamilyConfig, model_config
from attnlab.models.shape import DataShape
from attnlab.runs.checkpoint_files import (
    META_FILE,
    MODEL_FILE,
    STATE_FILE,
    Checkpoint,
    amount,
    checkpoint_bytes,
    write_checkpoint,
)
from attnlab.runs.migration import migrated_data, migrated_model, written_sizes
from attnlab.runs.train_config import TrainConfig
from attnlab.runs.weights_file import (
    WriteError,
    exported_weights,
    read_weights,
    verify_checksum,
    verify_checksums,
    weights_kind,
    write_failure,
)
from attnlab.tasks import TaskConfig, task_config


def _config_text(model: FamilyConfig, data: TaskConfig, train: TrainConfig) -> str:
    """config.yaml's text: the model, data and train sections."""
    return dump_yaml({"model": model.to_dict(), "data": data.to_dict(), "train": train.to_dict()})


class RunDir:
    """Paths of a run directory, and reading/writing its parts."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config = self.path / "config.yaml"
        self.checkpoints = self.path / "checkpoints"
        self.best_pointer = self.checkpoints / "best.json"
        self.metrics = self.path / "metrics.jsonl"
        self.tensorboard = self.path / "tensorboard"
        self.summary = self.path / "summary.json"
        self.pruned_heads = self.path / "pruned_heads.json"
        self.config_changes = self.path / "config_changes.jsonl"  # train settings changed on resume
        self.task_state = self.path / "task_state.json"  # what else the task keeps of its data (labels)
        self.init = self.path / "init.json"  # what train.init_from (or import-hf) loaded: runs/init.py
        self.shape = self.path / "shape.json"  # the data's sizes the model was built with: models/shape.py

    def tokenizer_file(self, role: str) -> Path:
        return self.path / f"tokenizer-{role}.json"

    def model_files(self) -> list[Path]:
        """The files that make the run's model and tokenizers, those it has: config.yaml, shape.json,
        the tokenizers, task_state.json and pruned_heads.json."""
        tokenizers = [self.tokenizer_file(role) for role in self.read_config()[1].task.tokenizers]
        return [p for p in (self.config, self.shape, *tokenizers, self.task_state, self.pruned_heads) if p.is_file()]

    # -- config and tokenizers ----------------------------------------------------------------
    def write_start(
        self,
        model: FamilyConfig,
        shape: DataShape,
        data: TaskConfig,
        train: TrainConfig,
        tokenizers: dict[str, Tokenizer | None],
        task_state: dict[str, Any],
        init: dict[str, Any] | None,
    ) -> None:
        """A new run's files, in this order, each written atomically: config.yaml (it marks the
        directory as a run), shape.json, the tokenizers, task_state.json (when the task keeps any)
        and init.json (when its weights start from another run's)."""
        files = [(self.config, _config_text(model, data, train)), (self.shape, shape.to_json())]
        files += [(self.tokenizer_file(role), tok.to_str()) for role, tok in tokenizers.items() if tok is not None]
        files += [(self.task_state, json.dumps(task_state, indent=2))] if task_state else []
        files += [(self.init, json.dumps(init, indent=2))] if init is not None else []
        for path, text in files:
            atomic_write_text(path, text)

    def write_config(self, model: FamilyConfig, shape: DataShape, data: TaskConfig, train: TrainConfig) -> None:
        """shape.json, then config.yaml (a resumed run's, whose train settings changed, or written before
        shape.json, whose model section held the data's sizes: both are written, shape.json first)."""
        atomic_write_text(self.shape, shape.to_json())
        atomic_write_text(self.config, _config_text(model, data, train))

    def record_config_changes(self, step: int, changes: list[str]) -> None:
        """Append the train settings changed when resuming at ``step`` to config_changes.jsonl."""
        with open(self.config_changes, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "changes": changes}) + "\n")

    def read_config(self) -> tuple[FamilyConfig, TaskConfig, TrainConfig]:
        if not self.config.exists():
            raise CheckpointError(f"{self.path}: not a run directory (no config.yaml)")
        sections = read_config_file(self.config)
        try:
            return (
                model_config(migrated_model(sections.get("model"))),
                task_config(migrated_data(sections.get("data") or {})),
                TrainConfig.from_dict(sections.get("train") or {}),
            )
        except ConfigError as err:
            raise CheckpointError(f"{self.config}: {err}") from None

    def read_shape(self) -> DataShape:
        """The data's sizes the run's model was built with: shape.json, or in a run written before it,
        those its config.yaml's model section kept (runs/migration.py)."""
        try:
            if self.shape.is_file():
                return DataShape.read(self.shape)
            if not self.config.exists():
                raise CheckpointError(f"{self.path}: not a run directory (no config.yaml)")
            return written_sizes(read_config_file(self.config).get("model"))
        except ConfigError as err:
            raise CheckpointError(str(err) if str(self.shape) in str(err) else f"{self.config}: {err}") from None

    def read_tokenizers(self) -> dict[str, Tokenizer | None]:
        """The tokenizers of the roles the run's task saves (tasks/task.py), by role: one object
        for roles saved as the same file (a shared vocabulary); 'src' and 'tgt' are None where a
        task of tokens has none (a language model has no src); a task without tokens has none ({})."""
        roles = self.read_config()[1].task.tokenizers
        tokenizers: dict[str, Tokenizer | None] = dict.fromkeys(("src", "tgt") if roles else ())
        by_text: dict[bytes, Tokenizer] = {}
        for role in roles:
            path = self.tokenizer_file(role)
            text = path.read_bytes() if path.is_file() else b""
            if text not in by_text:
                by_text[text] = Tokenizer.load(path)  # a missing or damaged file: one line naming it
            tokenizers[role] = by_text[text]
        return tokenizers

    def read_task_state(self) -> dict[str, Any]:
        """What the task saved of its data ({} when nothing)."""
        if not self.task_state.exists():
            return {}
        try:
            state = json.loads(self.task_state.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{self.task_state}: cannot read ({err})") from None
        if not isinstance(state, dict):
            raise CheckpointError(f"{self.task_state}: expected a JSON object")
        return state

    def read_init(self) -> dict[str, Any]:
        """init.json: what the run's first weights came from (see runs/init.py)."""
        try:
            report = json.loads(self.init.read_text(encoding="utf-8"))
            if not isinstance(report, dict) or not isinstance(report.get("untrained"), list):
                raise ValueError("expected an object with a list 'untrained'")
        except (OSError, UnicodeDecodeError, ValueError) as err:  # JSONDecodeError is a ValueError
            raise CheckpointError(f"{self.init}: cannot read ({err})") from None
        return report

    def read_pruned_heads(self) -> dict[str, list[int]]:
        """The heads `attnlab prune` cut out of the weights ({} when none were)."""
        if not self.pruned_heads.exists():
            return {}
        try:
            heads = json.loads(self.pruned_heads.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{self.pruned_heads}: {err}") from None
        if not isinstance(heads, dict):
            raise CheckpointError(f"{self.pruned_heads}: expected a mapping of module name to head indices")
        return heads

    # -- checkpoints ----------------------------------------------------------------------------
    def step_dir(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:06d}"

    def steps(self) -> list[int]:
        """Steps with a complete checkpoint, oldest first."""
        if not self.checkpoints.exists():
            return []
        return sorted(
            int(p.name[5:])
            for p in self.checkpoints.glob("step-*")
            if p.name[5:].isdigit() and (p / MODEL_FILE).exists()
        )

    def remove_partial_checkpoints(self) -> list[Path]:
        """Delete what a killed run left half-written: staging directories of checkpoints and the
        temporary file of best.json (never a published checkpoint)."""
        stale = [path for path in self.checkpoints.glob(".*") if is_leftover(path)]
        for path in stale:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        return stale

    def best_step(self) -> int | None:
        if not self.best_pointer.exists():
            return None
        return int(json.loads(self.best_pointer.read_text())["step"])

    def save(
        self,
        step: int,
        weights: dict[str, torch.Tensor],
        trainer_state: dict[str, Any],
        meta: dict[str, Any],
        keep_last: int,
        best: tuple[str, float] | None = None,
    ) -> Path:
        """Write a checkpoint atomically; with ``best`` = (metric, value), mark it the best; then drop
        the oldest checkpoints beyond ``keep_last``, never the best one."""
        staged, target = None, self.step_dir(step)
        try:
            staged = staging_dir(target)
            write_checkpoint(staged, weights, {"step": step, **meta}, trainer_state)
            publish_dir(staged, target)
            if best is not None:
                target = self.best_pointer
                atomic_write_text(self.best_pointer, json.dumps({"step": step, "metric": best[0], "value": best[1]}))
        except (WriteError, OSError) as err:  # a full disk, a read-only folder: the checkpoint is lost, the run is not
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)  # the partial files would only fill the disk further
            raise self._not_written(target, err, checkpoint_bytes(weights, trainer_state)) from None
        best_step = self.best_step()
        for old in self.steps()[:-keep_last]:
            if old != best_step:
                shutil.rmtree(self.step_dir(old))
        return self.step_dir(step)

    def _not_written(self, target: Path, err: WriteError | OSError, needed: int) -> CheckpointError:
        """One line for a checkpoint (or best.json) that could not be written: which file, where, why,
        the space the checkpoint needed and had, the last good checkpoint and how to go on from it."""
        reason = f"{err.path.name}: {err.reason}" if isinstance(err, WriteError) else write_failure(err)
        if target == self.best_pointer:
            what = f"{target} ({reason})"
        else:
            try:
                free = f", {amount(shutil.disk_usage(self.checkpoints).free)} free"
            except OSError:
                free = ""
            what = f"checkpoint {target} ({reason}; it needs about {amount(needed)}{free})"
        steps, resume = self.steps(), f"`attnlab train --out {self.path} --resume`"
        then = (
            f"the last good checkpoint is step {steps[-1]}: free some space, then continue with {resume}"
            if steps
            else f"no checkpoint was written before it: free some space, then {resume} starts it again from step 0"
        )
        return CheckpointError(f"could not write {what}; {then}")

    def metrics_at(self, step: int) -> dict[str, float]:
        """The validation metrics of the checkpoint at ``step`` ({} where it has none)."""
        try:
            metrics: dict[str, float] = json.loads((self.step_dir(step) / META_FILE).read_text()).get("metrics", {})
            return metrics
        except (OSError, ValueError):
            return {}

    def was_interrupted(self, step: int) -> bool:
        """Whether the checkpoint at ``step`` was written when Ctrl-C stopped the run (not evaluated)."""
        try:
            return bool(json.loads((self.step_dir(step) / META_FILE).read_text()).get("interrupted", False))
        except (OSError, ValueError):
            return False

    def intact(self, step: int) -> bool:
        """Whether every file of the checkpoint at ``step`` still has the checksum it was written with."""
        try:
            verify_checksums(self.step_dir(step))
        except CheckpointError:
            return False
        return True

    def read_checkpoint(self, step: int) -> Checkpoint:
        """The checkpoint at ``step``, every file verified and read (a damaged one: one line naming it)."""
        state = self.load_trainer_state(step)  # first: an export has weights but no state, and says so
        path = self.step_dir(step) / MODEL_FILE
        weights, metadata = read_weights(path)
        return Checkpoint(step, path, weights, metadata, state)

    def set_aside_after(self, step: int, metric: str, lower_is_better: bool) -> Path | None:
        """Move the checkpoints newer than ``step`` into checkpoints/set-aside-TIME/ (kept, no longer the
        run's: a resume from ``step`` writes its own) and point best.json at the best that remain by
        ``metric`` (``step`` itself when none was evaluated); the folder, or None when none was newer."""
        newer = [s for s in self.steps() if s > step]
        if not newer:
            return None
        folder = self.checkpoints / f"set-aside-{time.strftime('%Y%m%d-%H%M%S')}"
        folder.mkdir()
        for s in newer:
            self.step_dir(s).rename(folder / self.step_dir(s).name)
        if self.best_step() is not None and self.best_step() not in self.steps():
            if self.best_pointer.exists():
                self.best_pointer.rename(folder / self.best_pointer.name)
            scored = [(s, self.metrics_at(s)[metric]) for s in self.steps() if metric in self.metrics_at(s)]
            best, value = (min if lower_is_better else max)(scored, key=lambda sv: sv[1]) if scored else (step, None)
            atomic_write_text(self.best_pointer, json.dumps({"step": best, "metric": metric, "value": value}))
        return folder

    def load_trainer_state(self, step: int) -> dict[str, Any]:
        path = self.step_dir(step) / STATE_FILE
        model_file = self.step_dir(step) / MODEL_FILE
        if not path.exists() and model_file.exists() and (kind := weights_kind(model_file)) != "fp32":
            raise exported_weights(model_file, kind)  # an export keeps no training state
        verify_checksum(path)
        try:
            state: dict[str, Any] = torch.load(path, weights_only=True)
            return state
        except Exception as err:  # torch raises several types for damaged or unsafe files
            raise CheckpointError(f"{path}: cannot load training state ({str(err).splitlines()[0]})") from None
