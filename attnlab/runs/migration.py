"""The one migration of a model section written by an earlier release: a run directory's config.yaml
is read through :func:`migrated_model` (runs/run_dir.py, runs/config.py, `attnlab info RUN`), so
that no other code keeps an old layout alive. A new config file with a field in its old place is
refused in one line naming the new spelling (:func:`refuse_moved`).

Layouts read:
- release 0.1 (one flat ModelConfig): every family's fields in every run; a family's builder read
  only its own, so the others are dropped;
- before the attention stack had its config: d_model, n_heads, ... beside the other fields, moved
  into ``stack``;
- before the attention backends owned their options (issue 61): attention_window, sparse_stride,
  ... beside the other fields, moved into ``backends`` (nn/backends/: BackendOptions).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attnlab.errors import ConfigError
from attnlab.models import StackConfig, family_named
from attnlab.models.family import DEFAULT_ARCH

# The fields of the one flat ModelConfig of release 0.1.0: a run directory written then lists all of
# them for every arch.
RELEASE_0_1_FIELDS = (
    "vocab_size", "arch", "src_vocab_size", "d_model", "n_heads", "n_layers", "n_encoder_layers", "n_decoder_layers",
    "d_ff", "dropout", "attention_dropout", "activation", "norm", "layer_norm_eps", "positional", "positional_combine",
    "positional_dim", "positional_base", "max_relative_distance", "max_len", "tie_embeddings", "pad_id", "n_classes",
    "rnn_cell", "rnn_attention", "score", "bidirectional", "input_feeding", "attention_backend", "attention_window",
    "attention_block", "attention_key_block", "sparse_stride", "sparse_global", "sparse_random", "linear_features",
    "linear_n_features")

# A flat field of the Transformer families' config -> where it is now, in the composed ``backends``
MOVED_TO_BACKENDS = {
    "attention_block": "block",
    "attention_key_block": "chunked.key_block",
    "attention_window": "pattern.window",
    "sparse_stride": "pattern.stride",
    "sparse_global": "pattern.n_global",
    "sparse_random": "pattern.n_random",
    "linear_features": "linear.feature_map",
    "linear_n_features": "linear.random_features",
}


def migrated_model(data: Any) -> Any:
    """A run directory's model section as this release reads it: the attention stack's fields moved
    into ``stack`` and the backends' into ``backends`` where the family has them, less the fields
    release 0.1 wrote for every family and this one does not have; a section in the current layout
    is returned unchanged (a value that is not a mapping too: the family's config refuses it)."""
    if not isinstance(data, dict):
        return data
    own = family_named(data.get("arch", DEFAULT_ARCH)).config.field_names()
    if "stack" in own:
        stack_fields = [f.name for f in dataclasses.fields(StackConfig)]
        flat = {k: v for k, v in data.items() if k in stack_fields}
        data = {k: v for k, v in data.items() if k not in flat} | ({"stack": data.get("stack", {}) | flat} if flat else {})
    if "backends" in own:
        moved = {k: v for k, v in data.items() if k in MOVED_TO_BACKENDS}
        data = {k: v for k, v in data.items() if k not in moved}
        if moved:
            backends = dict(data.get("backends") or {})
            for name, value in moved.items():
                part, _, field = MOVED_TO_BACKENDS[name].rpartition(".")
                if part:
                    backends[part] = {**backends.get(part, {}), field: value}
                else:
                    backends[field] = value
            data["backends"] = backends
    return {k: v for k, v in data.items() if k in own or k == "arch" or k not in RELEASE_0_1_FIELDS}


def refuse_moved(names: Any, how: str = "") -> None:
    """A new config's model field (``names``: its keys, or the fields ``--set`` names) that is in an
    old place is refused in one line naming its new one; ``how``: what wrote it ('--set ...')."""
    for name in names:
        if name in MOVED_TO_BACKENDS:
            path = f"backends.{MOVED_TO_BACKENDS[name]}"
            inside = "".join(f"{part}: {{" for part in path.split(".")[:-1])
            raise ConfigError(f"{how}model.{name} is now model.{path}, an option of the attention backends "
                              f"(write {inside}{path.rpartition('.')[2]}: ...{'}' * path.count('.')}; "
                              f"--set model.{path}=...)")
