"""Typed configuration: dataclasses that check themselves when built and round-trip through YAML/JSON.

A config file is a YAML (or JSON) mapping with one section per dataclass::

    model:
      arch: encoder_decoder
      vocab_size: 37000
      d_model: 512

Every problem is reported as a :class:`~attnlab.errors.ConfigError` that names the field (with the
file when there is one), the value given and the values allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from attnlab.data.corpora import BUILTIN_TASKS
from attnlab.data.tokenizers import TOKENIZER_KINDS
from attnlab.errors import ConfigError, UsageError
from attnlab.nn.registry import (
    ACTIVATIONS,
    ARCHS,
    ATTENTION_BACKENDS,
    NORM_PLACEMENTS,
    POSITIONAL,
    POSITIONAL_COMBINE,
    RNN_ATTENTION,
    RNN_CELLS,
    SCORES,
    TIE_EMBEDDINGS,
)

# The sections a config file may hold, each parsed by its own dataclass.
SECTIONS = ("model", "data", "train")


def did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    """' (did you mean 'x'?)' when a choice is close to ``word``, else ''."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def one_of(field: str, value: Any, valid: typing.Iterable[str]) -> None:
    """Raise a ConfigError unless ``value`` is one of ``valid``; the message lists them all."""
    valid = list(valid)
    if value not in valid:
        listed = ", ".join(repr(v) for v in valid)
        raise ConfigError(f"{field} must be one of {listed} (got {value!r}){did_you_mean(str(value), valid)}")


def _type_name(tp: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _coerce(field: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against a field's type hint (int, float, str, bool, or Optional of them)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        hint = args[0]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{field} must be a finite number (got {value})")
    # bool is a subclass of int: `d_model: true` must not pass as 1.
    if not isinstance(value, hint) or (hint is not bool and isinstance(value, bool)):
        raise ConfigError(f"{field} must be {_type_name(hint)} (got {value!r})")
    return value


class TypedConfig:
    """Mixin for config dataclasses: type checks, dict/YAML/JSON round trip, did-you-mean on keys."""

    section: typing.ClassVar[str]

    def _check_types(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):  # configs are frozen: set the checked value underneath
            object.__setattr__(self, f.name, _coerce(f.name, getattr(self, f.name), hints[f.name]))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "TypedConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"section '{cls.section}' must be a mapping of field: value (got {type(data).__name__})")
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                raise ConfigError(f"unknown field '{key}' in section '{cls.section}'{did_you_mean(str(key), names)}")
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        for name in required:
            if name not in data:
                raise ConfigError(f"section '{cls.section}' needs the field '{name}'")
        return cls(**data)

    def to_yaml(self) -> str:
        return dump_yaml({self.section: self.to_dict()})

    def to_json(self) -> str:
        return json.dumps({self.section: self.to_dict()}, indent=2)

    @classmethod
    def from_file(cls, path: str | Path) -> "TypedConfig":
        """Read this class's section from a YAML or JSON config file."""
        sections = read_config_file(path)
        if cls.section not in sections:
            raise ConfigError(f"{path}: no '{cls.section}' section")
        try:
            return cls.from_dict(sections[cls.section])
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None


YAML12_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
                          r"|[0-9][0-9_]*[eE][-+]?[0-9]+|\.(?:inf|Inf|INF|nan|NaN|NAN))$")


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, with YAML 1.2 floats: ``3e-3`` and ``1E5`` are numbers, not strings
    (YAML 1.1, PyYAML's default, wants a dot: ``3.0e-3``)."""


class ConfigDumper(yaml.SafeDumper):
    """Writes what ConfigLoader reads back: a string such as ``1e5`` is quoted, since unquoted it
    would now read as a number."""


for _yaml_class in (ConfigLoader, ConfigDumper):
    _yaml_class.add_implicit_resolver("tag:yaml.org,2002:float", YAML12_FLOAT, list("-+0123456789."))


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=ConfigLoader)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=ConfigDumper, sort_keys=False)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Parse a config file into its sections, refusing unknown sections and unparsable text."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read config file ({err})") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else parse_yaml(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}:{err.lineno}: JSON does not parse: {err.msg}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: YAML does not parse: {getattr(err, 'problem', None) or err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping with sections {', '.join(SECTIONS)}")
    for key in data:
        if key not in SECTIONS:
            raise ConfigError(f"{path}: unknown section '{key}'{did_you_mean(str(key), SECTIONS)}")
    return data


@dataclass(frozen=True)
class ModelConfig(TypedConfig):
    """Every architectural choice of a Transformer-family model, one field per axis of variation.

    ``positional`` is applied where the method puts it: absolute encodings (``sinusoidal``,
    ``learned``) at the embeddings, added or concatenated (``positional_combine``); relative ones
    (``relative``, ``relative_bias``, ``rotary``, ``alibi``) inside every self-attention.
    ``tie_embeddings``: ``output`` ties the (decoder) input embedding to the output projection,
    ``src_tgt`` shares the source and target embeddings, ``all`` does both (the paper's choice).
    ``arch: rnn`` is a recurrent encoder-decoder: ``rnn_cell``, ``rnn_attention`` (``none`` = a fixed
    context), ``score`` (its alignment score), ``bidirectional`` and ``input_feeding`` (Luong) apply
    to it only; d_model is its embedding and hidden size.
    """

    section: typing.ClassVar[str] = "model"

    vocab_size: int
    arch: str = "encoder_decoder"
    src_vocab_size: Optional[int] = None
    d_model: int = 512
    n_heads: int = 8
    n_layers: int = 6
    n_encoder_layers: Optional[int] = None
    n_decoder_layers: Optional[int] = None
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: Optional[float] = None
    activation: str = "relu"
    norm: str = "post"
    layer_norm_eps: float = 1e-5
    positional: str = "sinusoidal"
    positional_combine: str = "add"
    positional_dim: Optional[int] = None
    positional_base: float = 10000.0
    max_relative_distance: int = 16
    max_len: int = 1024
    tie_embeddings: str = "all"
    pad_id: int = 0
    n_classes: int = 2
    rnn_cell: str = "gru"
    rnn_attention: str = "bahdanau"
    score: str = "additive"
    bidirectional: bool = True
    input_feeding: bool = True
    attention_backend: str = "math"
    attention_window: int = 128
    attention_block: int = 128
    attention_key_block: int = 1024
    sparse_stride: int = 0
    sparse_global: int = 0
    sparse_random: int = 0
    linear_features: str = "elu"
    linear_n_features: int = 64

    def __post_init__(self) -> None:
        self._check_types()
        one_of("arch", self.arch, ARCHS)
        one_of("rnn_cell", self.rnn_cell, RNN_CELLS)
        one_of("rnn_attention", self.rnn_attention, RNN_ATTENTION)
        one_of("score", self.score, SCORES)
        self._check_rnn()
        one_of("activation", self.activation, ACTIVATIONS)
        one_of("norm", self.norm, NORM_PLACEMENTS)
        one_of("positional", self.positional, POSITIONAL)
        one_of("positional_combine", self.positional_combine, POSITIONAL_COMBINE)
        one_of("tie_embeddings", self.tie_embeddings, TIE_EMBEDDINGS)
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_len", "max_relative_distance"):
            _at_least(name, getattr(self, name), 1)
        for name in ("src_vocab_size", "n_encoder_layers", "n_decoder_layers", "positional_dim"):
            if getattr(self, name) is not None:
                _at_least(name, getattr(self, name), 1)
        _at_least("n_classes", self.n_classes, 2)
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1) (got {value})")
        if self.layer_norm_eps <= 0:
            raise ConfigError(f"layer_norm_eps must be > 0 (got {self.layer_norm_eps})")
        if self.positional_base <= 1:
            raise ConfigError(f"positional_base must be > 1 (got {self.positional_base})")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        self._check_positional()
        self._check_vocabularies()
        self._check_backend()

    def _check_positional(self) -> None:
        absolute = POSITIONAL[self.positional].absolute
        if self.positional_combine == "concat":
            if not absolute:
                raise ConfigError(f"positional_combine 'concat' needs an absolute encoding "
                                  f"('sinusoidal' or 'learned'), not '{self.positional}'")
            if not 1 <= self.positional_width < self.d_model:
                raise ConfigError(f"positional_dim ({self.positional_width}) must be between 1 and "
                                  f"d_model - 1 ({self.d_model - 1}) when positional_combine is 'concat'")
            if "output" in self.tied:
                raise ConfigError("tie_embeddings 'output'/'all' needs token embeddings of width d_model; with "
                                  "positional_combine 'concat' use tie_embeddings 'none' or 'src_tgt'")
        elif self.positional_dim is not None:
            raise ConfigError("positional_dim is only used with positional_combine 'concat'")
        if self.positional == "sinusoidal" and self.positional_width % 2:
            raise ConfigError(f"sinusoidal positions need an even width (got {self.positional_width})")
        if self.positional == "rotary" and self.d_head % 2:
            raise ConfigError(f"rotary positions need an even head size d_model / n_heads (got {self.d_head})")

    def _only_with(self, setting: str, users: dict[str, tuple[str, ...]]) -> None:
        """Refuse a field set away from its default when ``setting`` (arch, attention_backend) has a
        value that does not use it: ``users`` maps each field to the values that do."""
        value = getattr(self, setting)
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, values in users.items():
            if value not in values and getattr(self, name) != defaults[name]:
                raise ConfigError(f"{name} is only used with {setting} {' or '.join(map(repr, values))} "
                                  f"({setting} is '{value}')")

    def _check_rnn(self) -> None:
        self._only_with("arch", {name: ("rnn",) for name in
                                 ("rnn_cell", "rnn_attention", "score", "bidirectional", "input_feeding")})
        if self.arch != "rnn":
            return
        if self.score in ("dot", "scaled_dot", "cosine") and self.bidirectional:
            raise ConfigError(f"score '{self.score}' compares the decoder state (d_model) with encoder states of "
                              f"size 2 x d_model (bidirectional): use 'general' or 'additive', or bidirectional: false")

    def _check_backend(self) -> None:
        one_of("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        one_of("linear_features", self.linear_features, ("elu", "favor"))
        for name in ("attention_block", "attention_key_block", "linear_n_features"):
            _at_least(name, getattr(self, name), 1)
        for name in ("attention_window", "sparse_stride", "sparse_global", "sparse_random"):
            _at_least(name, getattr(self, name), 0)
        self._only_with("attention_backend", {
            "attention_window": ("local", "sparse"), "attention_key_block": ("chunked",), "sparse_stride": ("sparse",),
            "sparse_global": ("sparse",), "sparse_random": ("sparse",), "linear_features": ("linear",),
            "linear_n_features": ("linear",)})
        backend = self.attention_backend
        if backend == "math":
            return
        if self.arch == "rnn":
            raise ConfigError(f"attention_backend '{backend}' computes multi-head attention, which arch 'rnn' "
                              f"does not have; leave attention_backend at 'math'")
        if self.positional == "relative":
            raise ConfigError(f"positional 'relative' (Shaw et al.) weights a value term by the attention "
                              f"probabilities, which only attention_backend 'math' forms (got '{backend}')")
        if backend == "linear" and POSITIONAL[self.positional].biases_scores:
            raise ConfigError(f"attention_backend 'linear' never forms scores, so positional '{self.positional}' "
                              f"has nothing to add its bias to; use 'rotary', 'sinusoidal' or 'learned'")
        if backend == "linear" and self.attn_dropout > 0:
            raise ConfigError(f"attention_backend 'linear' has no attention probabilities to drop; set "
                              f"attention_dropout: 0 (the residual dropout stays at {self.dropout})")

    def _check_vocabularies(self) -> None:
        unused = {"decoder_lm": "n_encoder_layers", "encoder_only": "n_decoder_layers"}.get(self.arch)
        if unused is not None and getattr(self, unused) is not None:
            raise ConfigError(f"{unused} is not used with arch '{self.arch}' (it has one stack: set n_layers)")
        if self.arch != "encoder_decoder":
            if self.src_vocab_size is not None:
                raise ConfigError(f"src_vocab_size is only used with arch 'encoder_decoder' (arch is '{self.arch}')")
            if self.tie_embeddings == "src_tgt":
                raise ConfigError(f"tie_embeddings 'src_tgt' needs arch 'encoder_decoder' (arch is '{self.arch}')")
        if "src_tgt" in self.tied and self.src_vocab != self.vocab_size:
            raise ConfigError(f"tie_embeddings '{self.tie_embeddings}' shares source and target embeddings, so "
                              f"src_vocab_size ({self.src_vocab_size}) must equal vocab_size ({self.vocab_size}); "
                              f"use tie_embeddings 'output' or 'none' for separate vocabularies")
        if not 0 <= self.pad_id < min(self.vocab_size, self.src_vocab):
            raise ConfigError(f"pad_id ({self.pad_id}) must be a token id below the vocabulary size "
                              f"({min(self.vocab_size, self.src_vocab)})")

    # -- derived quantities, so that no module recomputes them ------------------------------------
    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def encoder_layers(self) -> int:
        return self.n_encoder_layers if self.n_encoder_layers is not None else self.n_layers

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @property
    def attn_dropout(self) -> float:
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    @property
    def src_vocab(self) -> int:
        return self.src_vocab_size if self.src_vocab_size is not None else self.vocab_size

    @property
    def positional_width(self) -> int:
        """Width of an absolute positional vector: d_model when added, positional_dim when concatenated."""
        if self.positional_combine == "add":
            return self.d_model
        return self.positional_dim if self.positional_dim is not None else self.d_model // 2

    @property
    def token_width(self) -> int:
        """Width of a token embedding: what the positional vector leaves of d_model."""
        return self.d_model - (self.positional_width if self.positional_combine == "concat" else 0)

    @property
    def tied(self) -> tuple[str, ...]:
        """The ties in force: a subset of ('output', 'src_tgt')."""
        return {"none": (), "output": ("output",), "src_tgt": ("src_tgt",),
                "all": ("output", "src_tgt") if self.arch == "encoder_decoder" else ("output",)}[self.tie_embeddings]


def _at_least(field: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{field} must be >= {low} (got {value})")


DATA_FORMATS = ("builtin", "parallel", "tsv", "scan", "text")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # auto: bf16 where the hardware has it natively (train/precision.py)


@dataclass(frozen=True)
class DataConfig(TypedConfig):
    """Where the text comes from and how it becomes token ids.

    ``format``: ``builtin`` (a generated ``task``), ``parallel`` (``{train,valid,test}.{src_lang,tgt_lang}``
    line-aligned files), ``tsv`` (source TAB target), ``scan`` (``IN: ... OUT: ...`` lines) or ``text``
    (plain text for a language model; the last ``valid_fraction`` is validation unless ``valid`` is
    given). Relative paths are taken from the current directory.
    """

    section: typing.ClassVar[str] = "data"

    format: str = "builtin"
    task: Optional[str] = "scan"
    train: Optional[str] = None
    valid: Optional[str] = None
    test: Optional[str] = None
    src_lang: Optional[str] = None
    tgt_lang: Optional[str] = None
    tokenizer: str = "word"
    vocab_size: int = 8000
    shared_vocab: bool = True
    max_src_len: int = 256
    max_tgt_len: int = 256
    seed: int = 1234
    n_train: Optional[int] = None
    n_valid: int = 500
    n_test: int = 1000
    min_len: int = 3
    max_len: int = 12
    block_size: int = 64
    valid_fraction: float = 0.1

    def __post_init__(self) -> None:
        self._check_types()
        one_of("format", self.format, DATA_FORMATS)
        one_of("tokenizer", self.tokenizer, TOKENIZER_KINDS)
        if self.format == "builtin":
            one_of("task", self.task, BUILTIN_TASKS)
        elif self.train is None:
            raise ConfigError(f"format '{self.format}' needs 'train' (a file, or a path prefix for 'parallel')")
        if self.format == "parallel" and (self.src_lang is None or self.tgt_lang is None):
            raise ConfigError("format 'parallel' needs src_lang and tgt_lang (file suffixes, e.g. 'de' and 'en')")
        for name in ("vocab_size", "max_src_len", "max_tgt_len", "n_valid", "n_test", "min_len", "block_size"):
            _at_least(name, getattr(self, name), 1)
        if self.n_train is not None:
            _at_least("n_train", self.n_train, 1)
        if self.max_len < self.min_len:
            raise ConfigError(f"max_len ({self.max_len}) must be >= min_len ({self.min_len})")
        if not 0.0 < self.valid_fraction < 1.0:
            raise ConfigError(f"valid_fraction must be in (0, 1) (got {self.valid_fraction})")

    @property
    def is_lm(self) -> bool:
        return self.format == "text"


@dataclass(frozen=True)
class TrainConfig(TypedConfig):
    """How to train: the paper's recipe by default (Adam 0.9/0.98/1e-9, the inverse-square-root
    warm-up schedule, label smoothing 0.1), with budgets in steps, epochs or seconds."""

    section: typing.ClassVar[str] = "train"

    seed: int = 1
    max_steps: int = 10000
    max_epochs: Optional[int] = None
    max_seconds: Optional[float] = None
    max_tokens: int = 4096
    batch_size: int = 32
    accumulate: int = 1
    optimizer: str = "adam"
    lr_schedule: str = "noam"
    lr: float = 1.0
    warmup_steps: int = 4000
    min_lr: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: Optional[float] = 1.0
    precision: str = "fp32"
    activation_checkpointing: bool = False
    compile: bool = False
    device: str = "auto"
    eval_every: int = 500
    eval_exact_match: int = 0
    early_stop_metric: str = "valid_loss"
    patience: Optional[int] = None
    keep_last: int = 3
    log_every: int = 50
    progress: bool = True
    max_bad_steps: int = 5

    def __post_init__(self) -> None:
        self._check_types()
        one_of("optimizer", self.optimizer, ("adam", "adamw"))
        one_of("lr_schedule", self.lr_schedule, ("noam", "cosine", "constant"))
        one_of("precision", self.precision, PRECISIONS)
        one_of("device", self.device, ("auto", "cpu", "cuda"))
        one_of("early_stop_metric", self.early_stop_metric, ("valid_loss", "valid_ppl", "exact_match"))
        for name in ("max_steps", "max_tokens", "batch_size", "accumulate", "eval_every", "keep_last", "log_every",
                     "max_bad_steps"):
            _at_least(name, getattr(self, name), 1)
        for name in ("warmup_steps", "eval_exact_match"):
            _at_least(name, getattr(self, name), 0)
        for name in ("max_epochs", "patience"):
            if getattr(self, name) is not None:
                _at_least(name, getattr(self, name), 1)
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(f"need 0 <= min_lr ({self.min_lr}) <= lr ({self.lr}) and lr > 0")
        if self.lr_schedule == "noam" and self.warmup_steps == 0:
            raise ConfigError("lr_schedule 'noam' needs warmup_steps >= 1")
        for name in ("beta1", "beta2", "label_smoothing"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1) (got {getattr(self, name)})")
        if self.eps <= 0 or self.weight_decay < 0:
            raise ConfigError("eps must be > 0 and weight_decay >= 0")
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ConfigError(f"clip_norm must be > 0, or null for no clipping (got {self.clip_norm})")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ConfigError(f"max_seconds must be > 0 (got {self.max_seconds})")
        if self.early_stop_metric == "exact_match" and self.eval_exact_match == 0:
            raise ConfigError("early_stop_metric 'exact_match' needs eval_exact_match > 0 (examples to decode)")


FROM_TOKENIZER = ("vocab_size", "src_vocab_size", "pad_id")  # model fields a training run sets itself


def differences(old: TypedConfig, new: TypedConfig) -> list[str]:
    """The fields of one section that differ, as 'section.field: old -> new'."""
    a, b = old.to_dict(), new.to_dict()
    return [f"{old.section}.{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


@dataclass
class RunConfig:
    """A whole training run: the model section is kept as a mapping until the tokenizer has set
    vocab_size and pad_id (see :meth:`model_config`)."""

    model: dict[str, Any]
    data: DataConfig
    train: TrainConfig

    @classmethod
    def from_sections(cls, sections: dict[str, Any], where: str = "") -> "RunConfig":
        prefix = f"{where}: " if where else ""
        try:
            model = sections.get("model") or {}
            if not isinstance(model, dict):
                raise ConfigError("section 'model' must be a mapping of field: value")
            for fixed in FROM_TOKENIZER:
                if fixed in model:
                    raise ConfigError(f"model.{fixed} is set from the tokenizer in a training config; remove it")
            model_cfg = ModelConfig.from_dict({**model, "vocab_size": 8})  # check the other fields before data prep
            data = DataConfig.from_dict(sections.get("data") or {})
            train = TrainConfig.from_dict(sections.get("train") or {})
            _check_run(model_cfg, data, train)
            return cls(model, data, train)
        except ConfigError as err:
            raise ConfigError(f"{prefix}{err}") from None

    @classmethod
    def from_file(cls, path: str | Path, overrides: typing.Sequence[str] = (), of_a_run: bool = False) -> "RunConfig":
        """The config in ``path`` with ``--set`` overrides; ``of_a_run``: a run directory's
        config.yaml, whose model section also holds the fields its tokenizer set."""
        sections = read_config_file(path)
        if of_a_run and isinstance(sections.get("model"), dict):
            sections["model"] = {k: v for k, v in sections["model"].items() if k not in FROM_TOKENIZER}
        apply_overrides(sections, overrides)
        where = " ".join([str(path), *(f"--set {expr}" for expr in overrides)])  # the error may be in either
        return cls.from_sections(sections, where)

    def model_config(self, vocab_size: int, src_vocab_size: int | None, pad_id: int) -> ModelConfig:
        return ModelConfig.from_dict({**self.model, "vocab_size": vocab_size, "src_vocab_size": src_vocab_size,
                                      "pad_id": pad_id})

def _check_run(model: ModelConfig, data: DataConfig, train: TrainConfig) -> None:
    """Checks across sections: the architecture fits the data, and positions fit the lengths."""
    wanted = ("decoder_lm",) if data.is_lm else ("encoder_decoder", "rnn")
    if model.arch not in wanted:
        kind = "text for a language model" if data.is_lm else "sentence pairs"
        raise ConfigError(f"model.arch must be {' or '.join(repr(w) for w in wanted)} for data.format "
                          f"'{data.format}' ({kind}); got '{model.arch}'")
    if data.is_lm and train.eval_exact_match:
        raise ConfigError("train.eval_exact_match needs sentence pairs; a language model has none (set it to 0)")
    if model.positional == "learned":
        longest = data.block_size if data.is_lm else max(data.max_src_len, data.max_tgt_len) + 1
        if longest > model.max_len:
            raise ConfigError(f"model.max_len ({model.max_len}) must cover the longest sequence ({longest}) "
                              f"with learned positions")


SECTION_TYPES = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}


def apply_overrides(sections: dict[str, Any], overrides: typing.Sequence[str]) -> None:
    """Apply ``--set section.field=value`` expressions in place; values are parsed as YAML scalars."""
    for expr in overrides:
        key, sep, raw = expr.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise UsageError(f"--set {expr!r}: expected section.field=value, e.g. train.max_steps=100")
        if section not in SECTIONS:
            raise UsageError(f"--set {expr!r}: unknown section '{section}'{did_you_mean(section, SECTIONS)}")
        try:
            value = parse_yaml(raw) if raw.strip() else None
        except yaml.YAMLError:
            raise UsageError(f"--set {expr!r}: the value does not parse") from None
        fields = [f.name for f in dataclasses.fields(SECTION_TYPES[section])]
        if name not in fields:
            raise UsageError(f"--set {expr!r}: unknown field '{name}' in section '{section}'"
                             f"{did_you_mean(name, fields)}")
        sections.setdefault(section, {})
        if not isinstance(sections[section], dict):
            raise UsageError(f"--set {expr!r}: section '{section}' is not a mapping")
        sections[section][name] = value
