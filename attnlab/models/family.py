"""What a model family is, and the registry that selects one by ``model.arch``.

A family is one module that declares a :class:`ModelFamily`: its config dataclass (only its own
fields), its builder and its capabilities, registered with ``@register_family``. Everything that
depends on the kind of model asks the registry or the capabilities, never the family's name. The
sizes the data decides (vocabularies, image and series sizes, classes) are not config fields: they
come as one :class:`~attnlab.models.shape.DataShape`, ``build(cfg, shape)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, get_type_hints

from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from attnlab.config import TypedConfig, at_least, one_of, read_config_file, register
from attnlab.errors import ConfigError
from attnlab.models.shape import DataShape, refuse_sizes
from attnlab.models.stack import StackConfig
from attnlab.nn.backends import AttentionBackend
from attnlab.nn.interfaces import CausalLM, IncrementalDecoder, Seq2SeqModel, StagedModel


class InputKind(str):
    """What a family's models read and a task's examples are (``Capabilities.inputs``, a task's
    ``needs``): a name registered once, with what a model is given (``about``). The built-in kinds
    are :class:`Inputs`'; a new one is made by :func:`input_kind` in the module that brings it. A str,
    so that ``inputs == "images"`` reads as it says."""

    about: str

    def __reduce__(self) -> tuple[Any, tuple[str]]:  # unpickled as the registered kind itself
        return inputs_named, (str(self),)


INPUT_KINDS: dict[str, InputKind] = {}


def input_kind(name: str, about: str) -> InputKind:
    """Register the kind of input ``name``; ``about``: what a model is given, with its shape."""
    if name in INPUT_KINDS:
        raise ValueError(f"an input kind named {name!r} is already registered ({INPUT_KINDS[name].about})")
    kind = InputKind(name)
    kind.about = about
    INPUT_KINDS[name] = kind
    return kind


class Inputs:
    """The kinds of input of attnlab's own families."""

    TOKENS = input_kind("tokens", "token ids (B, T)")
    MASKED_TOKENS = input_kind("masked_tokens", "a source, and a target with some tokens masked (models/cmlm.py)")
    TOKEN_SEGMENTS = input_kind(
        "token_segments", "consecutive segments of one text, carried over (models/transformer_xl.py)"
    )
    IMAGES = input_kind("images", "pixels (B, C, H, W)")
    SERIES = input_kind("series", "a multivariate time series (B, L, C)")
    GRAPH = input_kind("graph", "a graph's node features and adjacency")
    IMAGE_TEXT = input_kind(
        "image_text", "an image and a text at once: apart (dual_encoder) or as one sequence (single_stream)"
    )


@dataclass(frozen=True)
class Capabilities:
    """What a family's models can do; commands and checks ask these, not the family's name. Made
    when the family's module is imported (its registration): ``inputs`` must name a registered
    :class:`InputKind`."""

    encoder: bool  # reads a source sequence (translation, classification)
    decoder: bool  # predicts tokens left to right (translation, generation)
    incremental_decoding: bool  # a cache makes each new token one step (decode/search.py)
    attention_weights: bool  # multi-head attention probabilities that capture_attention reads
    inputs: InputKind = Inputs.TOKENS

    def __post_init__(self) -> None:
        for name in ("encoder", "decoder", "incremental_decoding", "attention_weights"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"capability {name} must be True or False (got {getattr(self, name)!r})")
        object.__setattr__(self, "inputs", inputs_named(self.inputs))

    @classmethod
    def check_needs(cls, needs: dict[str, Any]) -> dict[str, Any]:
        """A task's ``needs`` (capability -> value), checked against these fields and values."""
        known = {f.name for f in dataclasses.fields(cls)}
        for name, value in needs.items():
            if name not in known:
                raise TypeError(f"a task needs unknown capability {name!r} (one of {', '.join(sorted(known))})")
            if name != "inputs" and not isinstance(value, bool):
                raise TypeError(f"a task needs capability {name} to be True or False (got {value!r})")
        return needs | ({"inputs": inputs_named(needs["inputs"])} if "inputs" in needs else {})


def inputs_named(value: Any) -> InputKind:
    """The registered kind of input named ``value``; an unknown one is refused, listing them."""
    if not isinstance(value, str) or value not in INPUT_KINDS:
        raise TypeError(
            f"capability inputs must be one of {', '.join(INPUT_KINDS)} (got {value!r}); a new kind is "
            f"registered with input_kind(name, about)"
        )
    return INPUT_KINDS[value]


class FamilyConfig(TypedConfig):
    """Base of every family's config dataclass: section 'model', ``arch`` naming the family."""

    section: ClassVar[str] = "model"
    selector: ClassVar[str] = "arch"
    link: ClassVar[str] = "family"
    family: ClassVar[type["ModelFamily"]]  # set by @register_family

    @property
    def arch(self) -> str:
        return self.family.name

    @property
    def capabilities(self) -> Capabilities:
        return self.family.capabilities

    def check(self) -> None:
        """The checks that span the parts the family's configs share (ModelFamily.check_config), then
        (in a subclass, after super().check()) the config's own."""
        self.family.check_config(self)

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model can encode positions for; None: no limit (the family's
        ModelFamily.max_positions)."""
        return self.family.max_positions(self)

    @property
    def longest_sequence(self) -> int | None:
        """The longest sequence the model is built for (a recurrent or convolutional family's
        ``max_len``, a Transformer family's ``positions.max_len``); None: the family has no such limit."""
        return self.family.longest_sequence(self)

    @property
    def tied(self) -> tuple[str, ...]:
        """The ties between embedding tables in force: a subset of ('output', 'src_tgt') (the family's
        ModelFamily.tied)."""
        return self.family.tied(self)

    def check_shape(self, shape: DataShape) -> None:
        """Refuse, in one line, the data's sizes this config cannot be built with (a patch that does not
        divide the image); a size the data has not given yet (None) is checked when it has. What holds
        whatever the family (classes from 2, a padding id inside every vocabulary) DataShape checks
        itself. The default: what the family checks of the parts its configs share
        (ModelFamily.check_config_shape)."""
        self.family.check_config_shape(self, shape)


@dataclass(frozen=True)
class Depths(TypedConfig):
    """Each side's layers in a family with a source and a target side (``model.depths``): the
    ``encoder``'s and the ``decoder``'s; None: the family's depth (its stack's n_layers, written
    ``model.n_layers`` in a recurrent or convolutional model's section)."""

    section: ClassVar[str] = "model.depths"

    encoder: int | None = None
    decoder: int | None = None

    def check(self) -> None:
        for name in ("encoder", "decoder"):
            if getattr(self, name) is not None:
                at_least(f"depths.{name}", getattr(self, name), 1)

    def encoder_layers(self, depth: int) -> int:
        """The encoder's layers: ``encoder``, else the family's ``depth``."""
        return self.encoder if self.encoder is not None else depth

    def decoder_layers(self, depth: int) -> int:
        """The decoder's layers: ``decoder``, else the family's ``depth``."""
        return self.decoder if self.decoder is not None else depth


@dataclass(frozen=True)
class Staging:
    """That pipeline parallelism (train.strategy pp, parallel/pipeline.py) may cut a family's models
    into stages at layer boundaries (the model's ``stages(n, head)``, nn/stages.py): ``layers(cfg)``,
    how many layers the stages share; ``heads``, the model's methods a last stage may end with (a
    task's ``pipeline_head``); ``check(cfg)`` refuses in one line what else cannot be cut."""

    layers: Callable[[Any], int]
    heads: tuple[str, ...] = ("forward",)
    check: Callable[[Any], None] = lambda cfg: None


class ModelFamily:
    """One kind of model: ``name`` (the value of model.arch), ``config`` (its dataclass),
    ``capabilities``, ``build(config, shape)`` -> a freshly initialised module of the data's sizes, and ``staging``, how its
    models cut into pipeline stages (None: they are not). ``model``, the class that ``build``
    returns (``build`` itself, or its return annotation), is set at registration, which checks it
    against the interfaces (nn/interfaces.py) that the capabilities and staging promise. A model
    that declares a ``tensor_plan()`` (nn/tensor_plan.py) may be split by train.strategy tp."""

    name: ClassVar[str]
    config: ClassVar[type[FamilyConfig]]
    capabilities: ClassVar[Capabilities]
    staging: ClassVar[Staging | None] = None
    model: ClassVar[type[nn.Module]]  # set by @register_family

    # What a family with an attention stack needs of its backend, as the backends declare what they
    # have (nn/backends/): a predicate, and why another backend does not fit. Any backend by default; a
    # family restricts them by setting these two (e.g. ``backends_fit = fields_free_exact``, read from the class).
    backends_fit: ClassVar[Callable[[type[AttentionBackend]], bool]] = staticmethod(lambda backend: True)
    backends_refusal: ClassVar[str] = ""

    # What the family's configs share, their checks and derived sizes: the defaults have no shared
    # parts (a family of several configs, such as the Transformer families' TransformerFamily, sets them)
    @classmethod
    def check_config(cls, cfg: FamilyConfig) -> None:
        """Checks across the parts that ``cfg`` shares with the family's other configs."""

    @classmethod
    def check_config_shape(cls, cfg: FamilyConfig, shape: DataShape) -> None:
        """Checks of the data's sizes against the parts that ``cfg`` shares."""

    @classmethod
    def max_positions(cls, cfg: FamilyConfig) -> int | None:
        """The longest sequence ``cfg``'s model can encode positions for; None: no limit."""
        return None

    @classmethod
    def longest_sequence(cls, cfg: FamilyConfig) -> int | None:
        """The longest sequence ``cfg``'s model is built for; None: no such limit."""
        return None

    @classmethod
    def tied(cls, cfg: FamilyConfig) -> tuple[str, ...]:
        """The ties between ``cfg``'s embedding tables in force; none by default."""
        return ()

    @classmethod
    def check_stack(cls, stack: StackConfig) -> None:
        """The ``stack``'s attention_backend is one that fits this family (StackConfig.check_backend)."""
        stack.check_backend(cls.backends_fit, cls.backends_refusal)

    @staticmethod
    def build(cfg: Any, shape: DataShape) -> nn.Module:
        raise NotImplementedError


FAMILIES: dict[str, type[ModelFamily]] = {}
DEFAULT_ARCH = "encoder_decoder"


def register_family(family: type[ModelFamily]) -> type[ModelFamily]:
    """Class decorator: make ``family`` selectable as ``model.arch: <family.name>``; refused in one
    line where its model class lacks an interface that its capabilities promise."""
    if not isinstance(family.capabilities, Capabilities):
        raise TypeError(f"model family '{family.name}' must declare its capabilities as a Capabilities")
    family.model = model_class(family)
    for interface, promise in promised_interfaces(family):
        if not issubclass(family.model, interface):
            missing = ", ".join(m for m in dir(interface) if not m.startswith("_") and not hasattr(family.model, m))
            raise TypeError(
                f"model family '{family.name}' declares {promise}, so its model must implement "
                f"{interface.__name__} (nn/interfaces.py); {family.model.__name__} lacks {missing}"
            )
    return register(FAMILIES, family, "model family")


def model_class(family: type[ModelFamily]) -> type[nn.Module]:
    """The class of ``family``'s models: ``build`` itself, or the class its return annotation names."""
    if isinstance(family.build, type):
        return family.build
    try:
        built = get_type_hints(family.build).get("return")
    except NameError:
        built = None
    if not (isinstance(built, type) and issubclass(built, nn.Module)):
        raise TypeError(
            f"model family '{family.name}': build must be its model's class, or name that class as its "
            f"return annotation"
        )
    return built


def promised_interfaces(family: type[ModelFamily]) -> list[tuple[type, str]]:
    """(protocol, the declaration that promises it) for each interface ``family``'s model must have."""
    can = family.capabilities
    promised: list[tuple[type, str]] = []
    if can.encoder and can.decoder:
        promised.append((Seq2SeqModel, "encoder and decoder"))
    elif can.decoder:
        promised.append((CausalLM, "decoder"))
    if can.incremental_decoding:
        promised.append((IncrementalDecoder, "incremental_decoding"))
    if family.staging is not None:
        promised.append((StagedModel, "staging"))
    return promised


def family_named(arch: Any) -> type[ModelFamily]:
    """The registered family that ``model.arch`` names; an unknown name is a ConfigError listing them."""
    one_of("arch", arch, FAMILIES)
    return FAMILIES[arch]


def model_config(data: dict[str, Any] | None = None, /, **fields: Any) -> FamilyConfig:
    """The config of the family that ``arch`` names (default encoder_decoder), from a model section
    (``data``) or keywords: ``model_config(arch="decoder_lm", stack={"d_model": 64})``. A size the
    data decides (``vocab_size``, ...) is refused: it is the DataShape's. A run directory's section,
    written by an earlier release, goes through runs/migration.py first."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"section 'model' must be a mapping of field: value (got {type(data).__name__})")
    data = fields if data is None else {**data, **fields}
    refuse_sizes(data)
    family = family_named(data.get("arch", DEFAULT_ARCH))
    return family.config.from_dict(data)


def read_model_config(path: str | Path) -> FamilyConfig:
    """The model section of a YAML or JSON config file, as its family's config."""
    sections = read_config_file(path)
    if "model" not in sections:
        raise ConfigError(f"{path}: no 'model' section")
    try:
        return model_config(sections["model"])
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def uncompiled(model: nn.Module) -> nn.Module:
    """The module inside torch.compile's wrapper (the module itself when not compiled)."""
    return getattr(model, "_orig_mod", model)


def unwrapped(model: nn.Module) -> nn.Module:
    """The model itself, inside torch.compile's and DDP's wrappers."""
    model = uncompiled(model)
    return model.module if isinstance(model, DDP) else model


def build_model(cfg: FamilyConfig, shape: DataShape) -> nn.Module:
    """A freshly initialised model of ``cfg``'s family, of the data's sizes ``shape``."""
    cfg.check_shape(shape)
    return cfg.family.build(cfg, shape)
