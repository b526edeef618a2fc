"""A weights file: a model's state dict in safetensors, tied tensors stored once (their aliases in
the metadata), written from CPU copies whatever the tensors' storage; for an export, bf16 or int8
weights (decode/weights.py's stored_state) with their kind and layout in the metadata; and the
sha256 checksums of a checkpoint directory, checked before any of its files is loaded. Every
failure is one line (CheckpointError). Run directories, which hold these files, are
runs/run_dir.py's."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from attnlab.decode.weights import LAYOUTS, load_stored_state, stored_state, weights_of
from attnlab.errors import CheckpointError
from attnlab.parallel.distributed import placed_like

CHECKSUM_FILE = "checksums.json"
WEIGHTS_KEY = "attnlab.weights"  # the metadata naming a weights file's kind, where it is not fp32 (an export)
LAYOUT_KEY = "attnlab.layout"  # and saying how such a file holds them (decode/weights.py LAYOUTS)


class WriteError(CheckpointError):
    """A file that could not be written (a full disk, a read-only folder): its path, what it holds and
    why, so that a caller can say which checkpoint was lost (runs/run_dir.py RunDir.save)."""

    def __init__(self, path: str | Path, what: str, reason: str) -> None:
        super().__init__(f"{path}: cannot save {what} ({reason})")
        self.path, self.what, self.reason = Path(path), what, reason


def write_failure(err: BaseException) -> str:
    """Why a write failed, in a few words: the system's reason for an error number ('No space left
    on device'), whether an OSError carries it or a library's message quotes it (safetensors' 'os
    error 28'); else the message's first line, less torch's '[enforce fail at FILE:LINE] .' prefix."""
    number = err.errno if isinstance(err, OSError) else None
    quoted = re.search(r"os error (\d+)|Os \{ code: (\d+)", str(err))
    if number is None and quoted:
        number = int(quoted.group(1) or quoted.group(2))
    if number is not None:
        return os.strerror(number)
    lines = str(err).strip().splitlines()
    return re.sub(r"^\[enforce fail at [^\]]*\]\s*\.?\s*", "", lines[0]) if lines else type(err).__name__


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checksums(directory: Path) -> None:
    """Record the sha256 of every file of a checkpoint directory (before it is published)."""
    sums = {f.name: _sha256(f) for f in sorted(directory.iterdir()) if f.is_file() and f.name != CHECKSUM_FILE}
    (directory / CHECKSUM_FILE).write_text(json.dumps(sums, indent=2))


def verify_checksum(path: Path) -> None:
    """Refuse ``path`` if its directory records a different sha256 for it (changed, truncated or
    swapped since it was written). Directories from before checksums were recorded pass."""
    record = path.parent / CHECKSUM_FILE
    if not record.exists():
        return
    try:
        expected = json.loads(record.read_text())[path.name]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        raise CheckpointError(f"{record}: damaged, or it does not list {path.name}") from None
    if not path.exists():
        raise CheckpointError(f"{path}: missing (listed in {record.name})")
    actual = _sha256(path)
    if actual != expected:
        raise CheckpointError(
            f"{path}: sha256 {actual[:16]}... differs from the recorded {expected[:16]}...: "
            f"the file was changed or damaged after it was written; refusing to load it"
        )


def verify_checksums(directory: Path) -> None:
    """:func:`verify_checksum` of every file that ``directory``'s record lists."""
    record = directory / CHECKSUM_FILE
    try:
        names = list(json.loads(record.read_text())) if record.exists() else []
    except (json.JSONDecodeError, TypeError, UnicodeDecodeError):
        raise CheckpointError(f"{record}: damaged") from None
    for name in names:
        verify_checksum(directory / name)


def stored_weights(weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A model's state dict as safetensors stores it: each a contiguous CPU copy of its own, whatever
    its storage (cuDNN keeps a recurrent layer's weights as views of one flat buffer; a GPU tensor
    cannot be written as it is). A name for a tensor already stored (tied weights: the same
    storage, offset, shape and strides) is not stored again but recorded as ``{name: stored name}``
    in the file's metadata, as safetensors' own ``save_model`` does, so files of either kind load."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[tuple[object, ...], str] = {}
    for name, t in weights.items():
        where = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if where in first:
            aliases[name] = first[where]
            continue
        first[where] = name
        tensors[name] = torch.empty(t.shape, dtype=t.dtype).copy_(t.detach())  # one copy, compact, on the CPU
    return tensors, aliases


def save_weights(weights: dict[str, torch.Tensor], path: str | Path, kind: str = "fp32") -> None:
    """Write a model's state dict (or, for ``kind`` bf16 or int8, its decode/weights.py stored_state) to
    a safetensors file (:func:`stored_weights`), the kind and its layout in the metadata where it is not
    fp32; any failure is one line."""
    tensors, aliases = stored_weights(weights)
    described = {WEIGHTS_KEY: kind, LAYOUT_KEY: LAYOUTS[kind]} if kind != "fp32" else {}
    try:
        save_file(tensors, str(path), metadata=(aliases | described) or None)
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise WriteError(path, "weights", write_failure(err)) from None


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load safetensors weights into ``model`` (on any device, in place, whatever its storage layout),
    refusing a file that fails its checksum, holds another kind of weights than the model (an
    export's bf16 or int8: see runs/checkpoint.py load_run), or missing, extra or mis-shaped tensors."""
    put_weights(model, path, *read_weights(path))


def read_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors of a safetensors file and its metadata, once its checksum has passed."""
    verify_checksum(Path(path))
    try:
        with safe_open(str(path), "pt") as f:
            metadata = f.metadata() or {}
        return load_file(str(path)), metadata
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path}: cannot load weights ({_first_line(err)})") from None


def put_weights(model: nn.Module, path: str | Path, stored: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """:func:`load_weights` once the file is read: ``metadata`` has its kind and its aliases (tied tensors)."""
    kind, held = metadata.get(WEIGHTS_KEY, "fp32"), weights_of(model)
    if kind != held:
        raise exported_weights(path, kind, held)
    try:
        wanted = stored_state(model)
        sources = {name: name if name in stored else metadata.get(name) for name in wanted}
        state = {name: stored[source] for name, source in sources.items() if source in stored}
        missing = [name for name in wanted if name not in state]
        unexpected = sorted(set(stored) - set(wanted))
        misshaped = [
            f"{name} {tuple(t.shape)} for {tuple(wanted[name].shape)}"
            for name, t in state.items()
            if t.shape != wanted[name].shape
        ]
        if missing or unexpected or misshaped:
            raise RuntimeError(
                "; ".join(
                    _listed(what, names)
                    for what, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
                    if names
                )
            )
        load_stored_state(model, placed_like(wanted, state))  # split as its own, if sharded
    except RuntimeError as err:
        raise CheckpointError(f"{path}: cannot load weights ({_first_line(err)})") from None


def weights_kind(path: str | Path) -> str:
    """The kind of weights a safetensors file holds (fp32, or an export's bf16 or int8), from its
    metadata alone."""
    try:
        with safe_open(str(path), "pt") as f:
            return str((f.metadata() or {}).get(WEIGHTS_KEY, "fp32"))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path}: cannot load weights ({_first_line(err)})") from None


def exported_weights(path: str | Path, kind: str, needed: str = "fp32") -> CheckpointError:
    """The error of a command given an export's ``kind`` weights where it needs ``needed`` ones."""
    return CheckpointError(
        f"{path}: holds {kind} weights, exported for decoding, where {needed} ones are needed "
        f"(training, resuming, averaging, exporting, pruning and init_from take a run's own "
        f"checkpoints)"
    )


def _listed(what: str, names: list[str]) -> str:
    """'missing 5 tensor(s): a, b, c ...'"""
    return f"{what} {len(names)} tensor(s): {', '.join(names[:3])}{' ...' * (len(names) > 3)}"


def _first_line(err: Exception) -> str:
    """The first line of an error that says something (load_state_dict's starts with a header)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Error(s) in loading state_dict"):
        return lines[1]
    return lines[0] if lines else type(err).__name__
