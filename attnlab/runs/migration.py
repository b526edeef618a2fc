"""The one migration of the model and data sections written by an earlier release: a run directory's
config.yaml is read through :func:`migrated_model` and :func:`migrated_data` (runs/run_dir.py,
runs/config.py, `attnlab info RUN`), so that no other code keeps an old layout alive. A new config
file with a field in its old place is refused in one line naming the new spelling
(:func:`refuse_moved`, :func:`refuse_moved_data`).

Layouts read:
- release 0.1 (one flat ModelConfig): every family's fields in every run; a family's builder read
  only its own, so the others are dropped;
- before the attention stack had its config: d_model, n_heads, ... beside the other fields, moved
  into ``stack``; so are the ablation switches (normalisation, residual, ffn, attention_scale: the
  Transformer families' and PatchTST's own fields before issue 61 made them the stack's);
- before configs composed their parts (issue 61): the attention backends' options (attention_window,
  sparse_stride, ...) beside the other fields, moved into ``backends`` (nn/backends/: BackendOptions),
  the patches' size and scheme (patch_size, patch_positional; ViT's positional) into ``patches``
  (models/vit.py: Patches), a two-sided model's n_encoder_layers / n_decoder_layers into
  ``depths`` (models/family.py: Depths), and the output projection's output_bias and
  output_vocabulary into ``output`` (models/transformer_config.py: Output), and a Transformer
  family's embedding, tie_embeddings and vocab_multiple into ``embeddings`` (TokenEmbeddings: kind,
  tie, vocab_multiple), and its positional, positional_combine, positional_dim, positional_base,
  max_relative_distance and max_len into ``positions`` (Positions: scheme, combine, dim, base,
  max_relative_distance, max_len);
- before the data's sizes had their own object (issue 61): vocab_size, pad_id, the image's sizes,
  n_classes, ... in the model section, and no shape.json; :func:`written_sizes` reads them as the
  run's DataShape (models/shape.py), and the model section is read without them.

Data sections read:
- release 0.1 (one flat DataConfig): every field for every format, and the generator named
  ``task``; the generator moves to ``generator`` and the fields the task does not have go;
- before data sections composed their parts (issue 61): the built-in scenes' held_out, image_size,
  noise and max_objects beside the other fields, moved into ``scenes`` (tasks/scene_splits.py:
  Scenes), the splits' seed (image classification's split_seed), n_train, n_valid and n_test into
  ``splits`` (tasks/parts.py: Splits; so are the language models', node classification's and
  forecasting's valid_fraction, test_fraction, and forecasting's train_rows, valid_rows, test_rows as
  n_train, n_valid, n_test: each task's that it reads, TaskConfig.splits_read), and the images' dataset, colour and resize into ``images``
  (ImageSource), and the text's tokenizer and vocab_size into ``text`` (Text); an image encoder's section loses the fields it had only as image classification's
  (DATA_DROPPED); translation's generator (a name) became a part, ``generator: {name, min_len,
  max_len, test_min_len, test_max_len, split}`` (tasks/pairs_section.py: PairGenerator), and its
  src_lang, tgt_lang, max_src_len, max_tgt_len and shared_vocab the part ``pairs`` (Pairs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attnlab.data.corpora import GENERATORS
from attnlab.errors import ConfigError
from attnlab.models import StackConfig, family_named
from attnlab.models.family import DEFAULT_ARCH
from attnlab.models.shape import SIZES, DataShape, refuse_sizes
from attnlab.tasks import TaskConfig
from attnlab.tasks.task import task_of

# The fields of the one flat ModelConfig of release 0.1.0: a run directory written then lists all of
# them for every arch.
RELEASE_0_1_FIELDS = (
    "vocab_size",
    "arch",
    "src_vocab_size",
    "d_model",
    "n_heads",
    "n_layers",
    "n_encoder_layers",
    "n_decoder_layers",
    "d_ff",
    "dropout",
    "attention_dropout",
    "activation",
    "norm",
    "layer_norm_eps",
    "positional",
    "positional_combine",
    "positional_dim",
    "positional_base",
    "max_relative_distance",
    "max_len",
    "tie_embeddings",
    "pad_id",
    "n_classes",
    "rnn_cell",
    "rnn_attention",
    "score",
    "bidirectional",
    "input_feeding",
    "attention_backend",
    "attention_window",
    "attention_block",
    "attention_key_block",
    "sparse_stride",
    "sparse_global",
    "sparse_random",
    "linear_features",
    "linear_n_features",
)

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


# A flat field of a family that reads images as patches -> where it is now, in the composed ``patches``;
# ViT's own ``positional`` placed its patches (the other families' places their tokens and stays)
MOVED_TO_PATCHES = {"patch_size": "size", "patch_positional": "positional"}
VIT_MOVED_TO_PATCHES = {**MOVED_TO_PATCHES, "positional": "positional"}
# A flat field of a family with two sides -> where it is now, in the composed ``depths``
MOVED_TO_DEPTHS = {"n_encoder_layers": "encoder", "n_decoder_layers": "decoder"}
# A flat field of a Transformer family's token tables -> where it is now, in the composed ``embeddings``
MOVED_TO_EMBEDDINGS = {"embedding": "kind", "tie_embeddings": "tie", "vocab_multiple": "vocab_multiple"}
# A flat field of a family that predicts tokens -> where it is now, in the composed ``output``
MOVED_TO_OUTPUT = {"output_bias": "bias", "output_vocabulary": "vocabulary"}
# A flat field of a Transformer family's positions -> where it is now, in the composed ``positions``
# (the recurrent and convolutional families' is written model.max_len: their Positions is flattened,
# and 'positions' is not among their section's fields)
MOVED_TO_POSITIONS = {
    "positional": "scheme",
    "positional_combine": "combine",
    "positional_dim": "dim",
    "positional_base": "base",
    "max_relative_distance": "max_relative_distance",
    "max_len": "max_len",
}
# A flat field of a family that classifies a whole input -> where it is now, in the composed ``classifier``
MOVED_TO_CLASSIFIER = {"pooling": "pooling", "head": "head"}


# The fields of the one flat DataConfig of release 0.1: a run directory written then lists all of
# them, for every format, and names the generator 'task'. Reading such a file drops those the task
# does not have (its reader never used them).
DATA_RELEASE_0_1_FIELDS = (
    "format",
    "task",
    "train",
    "valid",
    "test",
    "src_lang",
    "tgt_lang",
    "tokenizer",
    "vocab_size",
    "shared_vocab",
    "max_src_len",
    "max_tgt_len",
    "seed",
    "n_train",
    "n_valid",
    "n_test",
    "min_len",
    "max_len",
    "block_size",
    "valid_fraction",
)

# A flat field of a task's data section -> where it is now, by the part it went into (the task's
# config has a field of that name holding the part)
DATA_MOVED = {
    "scenes": {"held_out": "held_out", "image_size": "image_size", "noise": "noise", "max_objects": "max_objects"},
    "splits": {
        "seed": "seed",
        "split_seed": "seed",
        "n_train": "n_train",
        "n_valid": "n_valid",
        "n_test": "n_test",
        "valid_fraction": "valid_fraction",
        "test_fraction": "test_fraction",
        "train_rows": "n_train",
        "valid_rows": "n_valid",
        "test_rows": "n_test",
    },
    "images": {"dataset": "dataset", "colour": "colour", "resize": "resize"},
    "text": {"tokenizer": "tokenizer", "vocab_size": "vocab_size"},
    "generator": {n: n for n in ("min_len", "max_len", "test_min_len", "test_max_len", "split")},
    "pairs": {n: n for n in ("src_lang", "tgt_lang", "max_src_len", "max_tgt_len", "shared_vocab")},
}
# The fields a task's data section had only by inheriting another's, which it never read: dropped
# from a run written then (image_encoder's were image_classification's)
DATA_DROPPED = {"image_encoder": ("train", "valid", "test", "n_valid", "split_seed", "crop_padding", "flip")}


def moved(arch: str, own: list[str]) -> dict[str, str]:
    """The flat fields that the family ``arch`` (whose fields are ``own``) now keeps in a composed
    part: old name -> its path ('backends.pattern.window')."""
    paths: dict[str, str] = {}
    if "backends" in own:
        paths |= {name: f"backends.{path}" for name, path in MOVED_TO_BACKENDS.items()}
    if "patches" in own:
        paths |= {
            name: f"patches.{path}"
            for name, path in (VIT_MOVED_TO_PATCHES if arch == "vit" else MOVED_TO_PATCHES).items()
        }
    if "depths" in own:
        paths |= {name: f"depths.{path}" for name, path in MOVED_TO_DEPTHS.items()}
    if "output" in own:
        paths |= {name: f"output.{path}" for name, path in MOVED_TO_OUTPUT.items()}
    if "embeddings" in own:
        paths |= {name: f"embeddings.{path}" for name, path in MOVED_TO_EMBEDDINGS.items()}
    if "positions" in own:
        paths |= {name: f"positions.{path}" for name, path in MOVED_TO_POSITIONS.items()}
    if "classifier" in own:
        paths |= {name: f"classifier.{path}" for name, path in MOVED_TO_CLASSIFIER.items()}
    return paths


def migrated_model(data: Any) -> Any:
    """A run directory's model section as this release reads it: the attention stack's fields moved
    into ``stack`` and the backends' into ``backends`` where the family has them, less the fields
    release 0.1 wrote for every family and this one does not have, and less the data's sizes
    (:func:`written_sizes`); a section in the current layout is returned unchanged (a value that is
    not a mapping too: the family's config refuses it)."""
    if not isinstance(data, dict):
        return data
    data = {k: v for k, v in data.items() if k not in SIZES}
    own = family_named(data.get("arch", DEFAULT_ARCH)).config.field_names()
    if "stack" in own:
        stack_fields = [f.name for f in dataclasses.fields(StackConfig)]
        flat = {k: v for k, v in data.items() if k in stack_fields}
        data = {k: v for k, v in data.items() if k not in flat} | (
            {"stack": data.get("stack", {}) | flat} if flat else {}
        )
    data = moved_into_parts(data, moved(data.get("arch", DEFAULT_ARCH), own))
    return {k: v for k, v in data.items() if k in own or k == "arch" or k not in RELEASE_0_1_FIELDS}


def moved_into_parts(data: dict[str, Any], paths: dict[str, str]) -> dict[str, Any]:
    """``data`` with each flat field that ``paths`` names moved to its path ('backends.pattern.window')."""
    flat = {k: v for k, v in data.items() if k in paths}
    data = {k: v for k, v in data.items() if k not in flat}
    for name, value in flat.items():
        *parts, field = paths[name].split(".")
        mapping = data
        for part in parts:  # a copy of each mapping on the way: the section read is left as it was
            mapping[part] = dict(mapping.get(part) or {})
            mapping = mapping[part]
        mapping.setdefault(field, value)  # a value given in the new place (--set) wins over the flat one
    return data


def data_moved(config: type[TaskConfig]) -> dict[str, str]:
    """The flat fields that the data section ``config`` now keeps in a composed part: old name -> its
    path ('scenes.held_out')."""
    own = config.field_names()
    return {
        name: f"{part}.{path}"
        for part, fields in DATA_MOVED.items()
        if part in own
        for name, path in fields.items()
        if name not in own and (part != "splits" or path in config.splits_read)  # the splits the task reads
    }


def migrated_data(data: Any) -> Any:
    """A run directory's data section as this release reads it: written by release 0.1 (data.task
    names a generator), the generator moves to data.generator and the fields the task does not have
    go; a generator named by a string becomes its part's name (``generator: {name: ...}``); the flat
    fields of a part moved into it (DATA_MOVED), those a task had only by inheriting another's
    dropped (DATA_DROPPED); a section in the current layout is returned unchanged (a value that is
    not a mapping too: task_config refuses it)."""
    if not isinstance(data, dict):
        return data
    generator = data.get("task") if data.get("task") in GENERATORS else None
    if generator is not None:
        data = {k: v for k, v in data.items() if k != "task"}
    try:
        config = task_of(data).config
    except ConfigError:
        return data  # an unknown task: task_config refuses it, listing the tasks
    own, paths = config.field_names(), data_moved(config)
    if generator is not None:
        data = {k: v for k, v in data.items() if k in own or k in paths or k not in DATA_RELEASE_0_1_FIELDS}
        data = data | {"generator": generator} if "generator" in own else data
    if isinstance(data.get("generator"), str) and "generator" in own:
        data = {**data, "generator": {"name": data["generator"]}}
    data = moved_into_parts(data, paths)
    dropped = DATA_DROPPED.get(config.chosen_name(), ())
    return {k: v for k, v in data.items() if k not in dropped}


def refuse_moved_data(data: Any, names: Any, how: str = "") -> None:
    """A new config's data field (``names``: the section's keys, or the fields ``--set`` names) that
    is in an old place for the task ``data`` (the section) selects is refused in one line naming its
    new one; ``how``: what wrote it ('--set ...'). An unknown task is left to the config, which lists
    the tasks."""
    try:
        config = task_of(data if isinstance(data, dict) else {}).config
    except ConfigError:
        return
    paths = data_moved(config)
    if isinstance(data, dict) and isinstance(data.get("generator"), str) and "generator" in config.field_names():
        name = data["generator"]
        raise ConfigError(
            f"{how}data.generator is now a part of its own, named by its name (write generator: {{name: {name}}}; "
            f"--set data.generator.name={name})"
        )
    for name in names:
        if name in paths:
            path = paths[name]
            part, _, field = path.partition(".")
            raise ConfigError(
                f"{how}data.{name} is now data.{path}, in a part of its own "
                f"(write {part}: {{{field}: ...}}; --set data.{path}=...)"
            )


def written_sizes(data: Any) -> DataShape:
    """The data's sizes that a run written before shape.json kept in its model section ``data``,
    as its DataShape (a size its family did not have, written by release 0.1 for every family, is
    kept too: no builder reads it)."""
    return DataShape.from_dict(
        {k: v for k, v in data.items() if k in SIZES} if isinstance(data, dict) else {}, "model section"
    )


def refuse_moved(arch: Any, names: Any, how: str = "") -> None:
    """A new config's model field (``names``: its keys, or the fields ``--set`` names) that is in an
    old place for the family ``arch`` is refused in one line naming its new one (a size the data
    decides: that it is the data's); ``how``: what wrote it ('--set ...'). An unknown arch is left to
    the config, which lists the families."""
    try:
        own = family_named(arch).config.field_names()
    except ConfigError:
        return
    refuse_sizes(names, how)
    paths = moved(arch, own)
    for name in names:
        if name in paths and name not in own:
            path = paths[name]
            inside = "".join(f"{part}: {{" for part in path.split(".")[:-1])
            raise ConfigError(
                f"{how}model.{name} is now model.{path}, in a part of its own "
                f"(write {inside}{path.rpartition('.')[2]}: ...{'}' * path.count('.')}; "
                f"--set model.{path}=...)"
            )
