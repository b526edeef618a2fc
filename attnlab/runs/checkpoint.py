"""A run's model from its run directory (runs/run_dir.py): build_run_model (its family's model,
through the family registry, less the heads `attnlab prune` cut out), checkpoint_file (best, last,
average or a step), load_run (all that decoding needs; an export's bf16 or int8 weights are loaded
into a model converted as they were) and load_draft (another run as a draft for speculative
decoding, refused unless it shares the model's tokenizers).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from attnlab.data.tokenizers import Tokenizer
from attnlab.decode.weights import with_weights
from attnlab.errors import CheckpointError, UsageError
from attnlab.models import FamilyConfig, build_model
from attnlab.models.shape import DataShape
from attnlab.nn.attention import remove_heads
from attnlab.runs.checkpoint_files import MODEL_FILE
from attnlab.runs.run_dir import RunDir
from attnlab.runs.weights_file import WEIGHTS_KEY, put_weights, read_weights


def build_run_model(run: RunDir, model_cfg: FamilyConfig, shape: DataShape) -> nn.Module:
    """The run's architecture, freshly initialised: its family's model of the data's sizes ``shape``,
    less the heads `attnlab prune` removed."""
    model = build_model(model_cfg, shape)
    try:
        remove_heads(model, run.read_pruned_heads())
    except (ValueError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{run.pruned_heads}: {err}") from None
    return model


def checkpoint_file(run: RunDir, checkpoint: str = "best") -> Path:
    """The weights file of ``checkpoint``: 'best' (falling back to the newest), 'last', 'average'
    (written by runs/derived.py's ``write_average``) or a step number."""
    steps = run.steps()
    if checkpoint == "average":
        path = run.checkpoints / "average" / MODEL_FILE
        if not path.exists():
            raise CheckpointError(f"{run.path}: no averaged checkpoint (run `attnlab average {run.path}` first)")
        return path
    if not steps:
        raise CheckpointError(f"{run.path}: no checkpoint in {run.checkpoints}")
    if checkpoint == "best":
        best = run.best_step()
        step = best if best in steps else steps[-1]
    elif checkpoint == "last":
        step = steps[-1]
    elif checkpoint.isdigit() and int(checkpoint) in steps:
        step = int(checkpoint)
    else:
        raise CheckpointError(
            f"{run.path}: no checkpoint '{checkpoint}' (have best, last, average or a step of "
            f"{', '.join(map(str, steps))})"
        )
    return run.step_dir(step) / MODEL_FILE


def load_run(
    path: str | Path, checkpoint: str = "best", device: str | torch.device = "cpu"
) -> tuple[nn.Module, dict[str, Tokenizer | None], FamilyConfig]:
    """The model of a run directory in eval mode, with its tokenizers and config: all that
    decoding needs. ``checkpoint`` as in :func:`checkpoint_file`."""
    run = RunDir(path)
    model_cfg, _, _ = run.read_config()
    file = checkpoint_file(run, checkpoint)
    stored, metadata = read_weights(file)
    model = build_run_model(run, model_cfg, run.read_shape()).to(device).eval()
    kind = metadata.get(WEIGHTS_KEY, "fp32")
    try:
        with_weights(model, kind)  # an export's bf16 or int8 weights load into a model converted as they were
    except ValueError as err:
        raise UsageError(f"{run.path}: its {kind} weights cannot run here ({err})") from None
    put_weights(model, file, stored, metadata)
    return model, run.read_tokenizers(), model_cfg


def load_draft(
    path: str | Path, model: nn.Module, tokenizers: dict[str, Tokenizer | None], needs: dict[str, bool]
) -> nn.Module:
    """A draft for speculative decoding with ``model``: the best checkpoint of run ``path``, on the
    model's device, whose family has the capabilities ``needs`` and whose tokenizers are the
    model's (a draft's token ids must mean the same tokens)."""
    draft, draft_tokenizers, draft_cfg = load_run(path, "best", next(model.parameters()).device)
    if any(getattr(draft_cfg.capabilities, name) != value for name, value in needs.items()):
        raise UsageError(f"draft {path} holds a model of arch '{draft_cfg.arch}', which cannot draft for this model")
    for role, tok in tokenizers.items():
        other = draft_tokenizers.get(role)
        if tok is not None and (
            other is None
            or other.vocab_size != tok.vocab_size
            or other.id_tokens(range(tok.vocab_size)) != tok.id_tokens(range(tok.vocab_size))
        ):
            raise UsageError(
                f"draft {path} has another {role} vocabulary than the model; a draft must share the model's tokenizers"
            )
    return draft
