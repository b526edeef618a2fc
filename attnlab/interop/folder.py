"""What every Hugging Face conversion shares (`attnlab import-hf`, `attnlab export-hf`): reading a
model folder safely, the converters by ``model_type`` and by attnlab family, and writing the run or
the folder.

A folder is read from three kinds of file and nothing else, never over the network:
``config.json`` (its ``model_type`` chooses the :class:`HFConverter`), ``model.safetensors`` (a
pickled ``pytorch_model.bin`` is refused before anything is opened: unpickling can run code) and
the tokenizer's own files (a Marian model's SentencePiece models; an image model's
``preprocessor_config.json`` instead). Each architecture is one module of this package that
registers its converter (bert.py, gpt2.py, marian.py, vit.py); the import and the export look it up
here, by ``model_type`` and by the run's ``arch``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from operator import attrgetter
from pathlib import Path
from types import MethodType
from typing import Any, ClassVar, TypeVar, cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from attnlab.data.tokenizers import Tokenizer
from attnlab.errors import CheckpointError, ConfigError, UsageError
from attnlab.files import atomic_write_bytes, atomic_write_text, publish_dir, staging_dir
from attnlab.models import FamilyConfig, model_config
from attnlab.models.shape import DataShape
from attnlab.runs.checkpoint import load_run
from attnlab.runs.checkpoint_files import write_checkpoint
from attnlab.runs.init import InitReport
from attnlab.runs.run_dir import RunDir
from attnlab.runs.train_config import TrainConfig
from attnlab.tasks import TaskConfig

WEIGHTS, PICKLED, CONFIG = "model.safetensors", "pytorch_model.bin", "config.json"
HIDDEN_ACTS = {
    "gelu": "gelu",
    "gelu_tanh": "gelu_new",
    "relu": "relu",
    "silu": "silu",
}  # -> BERT's and ViT's hidden_act


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object, or one line naming the file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: cannot read ({err})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return value


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(folder / WEIGHTS))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{folder / WEIGHTS}: cannot read ({err})") from None


def unlike(cfg: FamilyConfig, needs: Mapping[str, Any], whose: str) -> list[str]:
    """'field value (``whose`` is value)' for each field of ``needs`` (a dotted path of ``cfg``) whose value
    differs from the architecture's: the export refusals every converter lists."""
    return [
        f"{name} {attrgetter(name)(cfg)!r} ({whose} is {value!r})"
        for name, value in needs.items()
        if attrgetter(name)(cfg) != value
    ]


C = TypeVar("C", bound=FamilyConfig)


def checked_config(fields: dict[str, Any], shape: DataShape, where: Path, family: type[C]) -> C:
    """The model section an import writes, typed and checked against the data's ``shape``: one that attnlab
    refuses is the folder's fault, in one line naming ``where`` (its config.json)."""
    try:
        cfg = model_config(fields)
        cfg.check_shape(shape)
    except ConfigError as err:
        raise CheckpointError(f"{where}: {err}") from None
    assert isinstance(cfg, family)  # fields' arch is the family's
    return cfg


class HFConverter:
    """One Hugging Face architecture and the attnlab family it is. A subclass names its
    ``model_type``, the ``arch`` it becomes, the tokenizer files it reads (``tokenizer_files``: any
    one of these sets), and converts each way."""

    model_type: ClassVar[str]
    arch: ClassVar[str]
    described: ClassVar[str]  # the models it covers, for the list of supported ones
    tokenizer_files: ClassVar[tuple[tuple[str, ...], ...]] = (("tokenizer.json",),)

    @classmethod
    def import_folder(cls, folder: Path, config: dict[str, Any]) -> "Imported":
        """The run a checked folder makes (its config.json already read)."""
        raise NotImplementedError

    @classmethod
    def export_refusals(cls, cfg: FamilyConfig, data: TaskConfig, run: RunDir | None) -> list[str]:
        """The run's options that the architecture has no counterpart for ([] when it can be exported):
        of its model and data sections, and of ``run``'s files (pruned heads, the tokenizers; None for
        a config not trained yet: nothing pruned, each side's tokenizer as its data section says)."""
        return []

    @classmethod
    def refusal(cls, cfg: FamilyConfig, data: TaskConfig, run: RunDir | None = None) -> str | None:
        """Why export-hf does not write the run (``run`` None: a config's run, once trained) as this
        architecture, in one line; None where it does. `attnlab info` asks every exporter this."""
        if cfg.arch != cls.arch:
            return f"arch '{cfg.arch}': {cls.model_type} folders are written from arch '{cls.arch}' runs"
        refused = cls.export_refusals(cfg, data, run)
        return f"{cls.described} has no counterpart for {'; '.join(refused)}" if refused else None

    @classmethod
    def export_run(
        cls, model: nn.Module, cfg: FamilyConfig, tokenizers: dict[str, Tokenizer], run: RunDir
    ) -> "Exported":
        """The folder a run that passed :meth:`export_refusals` makes (``tokenizers``: the run's, by role)."""
        raise CheckpointError(f"{run.path}: arch '{cfg.arch}' has no Hugging Face export")


CONVERTERS: dict[str, type[HFConverter]] = {}  # model_type -> converter
EXPORTERS: dict[str, type[HFConverter]] = {}  # attnlab arch -> the converter that exports it


def register_converter(cls: type[HFConverter]) -> type[HFConverter]:
    CONVERTERS[cls.model_type] = cls
    # a classmethod read from its class is a bound method (mypy types it as a plain callable)
    if cast(MethodType, cls.export_run).__func__ is not cast(MethodType, HFConverter.export_run).__func__:
        EXPORTERS[cls.arch] = cls
    return cls


class Imported:
    """What an import writes: the model, its config sections and the data's sizes it was built with,
    the tokenizer (None for a model of
    images; by role, ``{"src": ..., "tgt": ...}``, where the sides differ), the report of what was
    loaded (with ``init``: what else init.json keeps, such as the token order) and ``task_state``,
    what the task keeps of its data (an image model's classes and pixel statistics)."""

    def __init__(
        self,
        model: nn.Module,
        model_cfg: FamilyConfig,
        shape: DataShape,
        data: TaskConfig,
        tokenizer: Tokenizer | dict[str, Tokenizer] | None,
        report: InitReport,
        init: dict[str, Any] | None = None,
        train: TrainConfig | None = None,
        task_state: dict[str, Any] | None = None,
    ) -> None:
        self.model, self.model_cfg, self.shape, self.data, self.tokenizer = model, model_cfg, shape, data, tokenizer
        self.report, self.init = report, init or {}
        self.train = train or TrainConfig(progress=False)
        self.task_state = task_state or {}

    def tokenizers(self) -> dict[str, Tokenizer | None]:
        """The tokenizer of each role the task saves."""
        roles = self.data.task.tokenizers
        return dict(self.tokenizer) if isinstance(self.tokenizer, dict) else {role: self.tokenizer for role in roles}


class Exported:
    """What an export writes: config.json, the tensors under their Hugging Face names, and the
    tokenizer's files (name -> text, or bytes: a SentencePiece model)."""

    def __init__(
        self, config: dict[str, Any], tensors: dict[str, torch.Tensor], files: Mapping[str, str | bytes]
    ) -> None:
        self.config, self.tensors, self.files = config, tensors, files


def renumbered_spec(tokenizer: Tokenizer, ids: list[int], rename: dict[str, str]) -> dict[str, Any]:
    """The run's tokenizer.json (as a dict) with its tokens at an export's ids (``ids[i]``: the run's
    id of the export's id i; tokens left out of ``ids`` are dropped) and control tokens renamed
    (``rename``: attnlab's name -> the architecture's)."""
    spec = json.loads(tokenizer.to_str())
    new_id = {ours: theirs for theirs, ours in enumerate(ids)}
    model = spec["model"]
    if model["type"] == "Unigram":  # its vocab: [token, log-probability] pairs, by id
        model["vocab"] = [[rename.get(token, token), score] for token, score in (model["vocab"][i] for i in ids)]
        model["unk_id"] = new_id.get(model["unk_id"]) if model.get("unk_id") is not None else None
    else:
        model["vocab"] = {rename.get(token, token): new_id[i] for token, i in model["vocab"].items() if i in new_id}
    if model.get("unk_token") is not None:
        model["unk_token"] = rename.get(model["unk_token"], model["unk_token"])
    spec["added_tokens"] = [
        entry | {"id": new_id[entry["id"]], "content": rename.get(entry["content"], entry["content"])}
        for entry in spec.get("added_tokens", [])
        if entry["id"] in new_id
    ]
    return spec


def check_folder(folder: Path) -> type[HFConverter]:
    """The converter of a model folder, after the checks every folder must pass: it exists, its
    weights are not pickled, it has config.json, a supported model_type, and the files that
    converter reads."""
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such folder")
    if not (folder / WEIGHTS).is_file() and (folder / PICKLED).is_file():
        raise CheckpointError(
            f"{folder}: the weights are a pickled {PICKLED}, which can run code when "
            f"loaded; attnlab reads {WEIGHTS} only (convert it where you trust the file)"
        )
    present = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
    if not (folder / CONFIG).is_file():
        raise CheckpointError(f"{folder}: no {CONFIG}, so nothing says what model the folder holds (found {present})")
    config = read_json(folder / CONFIG)
    converter = CONVERTERS.get(config.get("model_type", ""))  # no model_type: no converter has ''
    if converter is None:
        supported = ", ".join(f"'{t}' ({CONVERTERS[t].described})" for t in sorted(CONVERTERS))
        raise CheckpointError(
            f"{folder / CONFIG}: model_type is {config.get('model_type')!r}; attnlab imports model_type {supported}"
        )
    tokenizer_ok = any(all((folder / name).is_file() for name in names) for names in converter.tokenizer_files)
    missing = [] if (folder / WEIGHTS).is_file() else [WEIGHTS]
    if not tokenizer_ok:
        missing.append(" or ".join(" + ".join(names) for names in converter.tokenizer_files))
    if missing:
        raise CheckpointError(f"{folder}: missing {', '.join(missing)} (found {present})")
    return converter


def import_hf(folder: str | Path, out: str | Path) -> Imported:
    """Write the run directory ``out`` (which must not exist, or be empty) from a Hugging Face folder."""
    folder, out = Path(folder), Path(out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} already exists and is not empty; choose another --out")
    converter = check_folder(folder)
    imported = converter.import_folder(folder, read_json(folder / CONFIG))
    staged = staging_dir(out)
    run = RunDir(staged)
    run.write_start(
        imported.model_cfg,
        imported.shape,
        imported.data,
        imported.train,
        imported.tokenizers(),
        imported.task_state,
        imported.report.to_dict() | imported.init,
    )
    run.step_dir(0).mkdir(parents=True)
    write_checkpoint(run.step_dir(0), imported.model.state_dict(), {"step": 0, "imported_from": str(folder.resolve())})
    publish_dir(staged, out)
    return imported


def export_hf(run_dir: str | Path, out: str | Path, checkpoint: str = "best") -> tuple[type[HFConverter], Path]:
    """Write the Hugging Face folder ``out`` (which must not exist, or be empty) of a run's checkpoint:
    the converter used and the weights file read."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} already exists and is not empty; choose another --out")
    run = RunDir(run_dir)
    cfg, data, _ = run.read_config()
    converter = EXPORTERS.get(cfg.arch)
    if converter is None:
        have = ", ".join(f"'{arch}' (as '{c.model_type}')" for arch, c in EXPORTERS.items())
        raise UsageError(
            f"{run.path}: arch '{cfg.arch}' has no Hugging Face counterpart that attnlab exports "
            f"(it exports arch {have})"
        )
    refused = converter.refusal(cfg, data, run)
    if refused:
        raise ConfigError(f"{run.path}: {refused}")
    model, tokenizers, _ = load_run(run.path, checkpoint)
    # each role the task saves has its tokenizer (RunDir.read_tokenizers: None only for the others)
    exported = converter.export_run(
        model, cfg, cast(dict[str, Tokenizer], {role: tokenizers[role] for role in data.task.tokenizers}), run
    )
    staged = staging_dir(out)
    atomic_write_text(staged / CONFIG, json.dumps(exported.config, indent=2) + "\n")
    save_file(
        {name: t.detach().contiguous().clone() for name, t in exported.tensors.items()},
        str(staged / WEIGHTS),
        metadata={"format": "pt"},
    )
    for name, content in exported.files.items():
        if isinstance(content, bytes):
            atomic_write_bytes(staged / name, content)
        else:
            atomic_write_text(staged / name, content)
    publish_dir(staged, out)
    return converter, out
