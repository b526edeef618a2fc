"""One checkpoint's files, checkpoints/step-N/ of a run directory (runs/run_dir.py, whose RunDir saves,
lists and reads them): their names (model.safetensors, trainer_state.pt, meta.json), write_checkpoint,
which writes them and then their checksums (every checkpoint writer goes through it), Checkpoint, one
read whole and verified, and checkpoint_bytes, about what one takes on disk (amount: bytes for a
person). The weights file and the checksums themselves are runs/weights_file.py's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from attnlab.runs.weights_file import CHECKSUM_FILE, WriteError, save_weights, write_checksums, write_failure

MODEL_FILE, STATE_FILE, META_FILE = "model.safetensors", "trainer_state.pt", "meta.json"


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint read whole and verified: its step, its weights as stored (with the file's path and
    metadata, which name tied tensors and the kind of weights) and the trainer's state. A resume reads
    it before anything of the run changes."""

    step: int
    path: Path
    weights: dict[str, torch.Tensor]
    metadata: dict[str, str]
    state: dict[str, Any]


def write_checkpoint(
    directory: Path,
    weights: dict[str, torch.Tensor],
    meta: dict[str, Any],
    trainer_state: dict[str, Any] | None = None,
    kind: str = "fp32",
) -> None:
    """The files of one checkpoint (a model's state dict, or weights of another ``kind`` as
    :func:`save_weights` takes them; the trainer's state if any; meta.json), then their checksums,
    which every load verifies. Every checkpoint writer goes through here."""
    save_weights(weights, directory / MODEL_FILE, kind)
    if trainer_state is not None:
        _write(directory / STATE_FILE, "training state", lambda path: torch.save(trainer_state, path))
    _write(directory / META_FILE, "metadata", lambda path: path.write_text(json.dumps(meta, indent=2)))
    _write(directory / CHECKSUM_FILE, "checksums", lambda _: write_checksums(directory))


def _write(path: Path, what: str, write: Callable[[Path], object]) -> None:
    """``write(path)``, whose failure is one WriteError naming ``path``: torch.save's writer reports a
    full disk as a RuntimeError ('unexpected pos 291584 vs 291476', 'file write failed')."""
    try:
        write(path)
    except (OSError, RuntimeError) as err:
        raise WriteError(path, what, write_failure(err)) from None


def checkpoint_bytes(*parts: Any) -> int:
    """About the bytes a checkpoint of ``parts`` (state dicts, a trainer state: nested dicts, lists
    and tensors) takes on disk: its tensors' data, each storage once (tied weights are stored once)."""
    seen: set[tuple[int, int]] = set()
    total = 0

    def walk(value: Any) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            try:
                key = (value.data_ptr(), value.numel())
            except RuntimeError:  # a tensor without storage of its own (a DTensor shard's wrapper)
                key = (id(value), value.numel())
            if key not in seen:
                seen.add(key)
                total += value.numel() * value.element_size()
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    for part in parts:
        walk(part)
    return total


def amount(n: float) -> str:
    """Bytes for a person: '291.6 kB', '1.3 MB'."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"
