"""What the Transformer families' configs share: beside their attention stack (models/stack.py),
the parts each declares, ``positions`` (Positions), ``embeddings`` (TokenEmbeddings) and
``backends`` (the backends' options, nn/backends/); ``output`` (Output), the output projection of
the families that predict tokens. :class:`TransformerConfig` is the Protocol of what such a config
offers, :class:`TransformerFamily` the base of their families, with the checks that span the parts.
The ablation switches are the stack's. The builders that turn them into modules are in
models/transformer.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Protocol, cast

from attnlab.config import TypedConfig, at_least, one_of
from attnlab.errors import ConfigError
from attnlab.models.family import FamilyConfig, ModelFamily
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig
from attnlab.nn.backends import BackendOptions
from attnlab.nn.registry import (
    ATTENTION_BACKENDS,
    POSITIONAL,
    POSITIONAL_COMBINE,
)

EMBEDDINGS = (
    "scaled",
    "normed",
    "plain",
)  # E sqrt(D) + PE (Vaswani et al.), LayerNorm(E + PE + S) (BERT), E + PE (GPT-2)
SINGLE_STACK_TIES = ("none", "output", "all")  # 'all' = 'output' where there is one embedding table
TWO_TABLE_TIES = ("none", "output", "src_tgt", "all")  # a source and a target table: 'all' = both ties
TIED = {"none": (), "output": ("output",), "src_tgt": ("src_tgt",), "all": ("output", "src_tgt")}


@dataclass(frozen=True)
class Output(TypedConfig):
    """The output projection over the target vocabulary (``model.output``) of a family that predicts
    tokens: ``bias``, a bias per token on the logits (Marian's final_logits_bias; the paper has none);
    ``vocabulary``, the token ids it never predicts (their logits -inf): ``all``, none; ``no_bos``,
    <bos>, which only starts a decoder (an imported Marian model's added start token, interop/marian.py);
    ``text``, the control tokens <pad>, <bos> and <unk> (a model imported from a vocabulary without
    them: GPT-2's, interop/gpt2.py), so that the distribution over the original's tokens stays the
    original's. A family says which vocabularies it has (``vocabularies``)."""

    section: ClassVar[str] = "model.output"

    bias: bool = False
    vocabulary: str = "all"

    # vocabulary -> the ids never predicted (data/tokenizers.py's <pad> 0, <bos> 1, <unk> 3: a layer this
    # one does not import)
    NEVER: ClassVar[dict[str, tuple[int, ...]]] = {"all": (), "no_bos": (1,), "text": (0, 1, 3)}

    def check(self) -> None:
        one_of("output.vocabulary", self.vocabulary, self.NEVER)

    @property
    def never(self) -> tuple[int, ...]:
        """The token ids whose logits are -inf."""
        return self.NEVER[self.vocabulary]

    def check_vocabulary(self, vocabularies: tuple[str, ...]) -> None:
        """A ``vocabulary`` that the family has (``vocabularies``)."""
        one_of("output.vocabulary", self.vocabulary, vocabularies)

    def check_shape(self, shape: DataShape) -> None:
        """A vocabulary of the data's larger than the ids never predicted."""
        if self.never and shape.vocab_size is not None and shape.vocab_size <= max(self.never):
            raise ConfigError(
                f"output.vocabulary '{self.vocabulary}' leaves out token ids "
                f"{', '.join(map(str, self.never))}; vocab_size ({shape.vocab_size}) must be larger"
            )


@dataclass(frozen=True)
class TokenEmbeddings(TypedConfig):
    """The token tables of a Transformer family (``model.embeddings``): ``kind``, how a token's vector
    and its absolute position make the input (``scaled``, the paper's E[w] sqrt(D) + PE; ``normed``,
    BERT's LayerNorm(E[w] + PE + segment), unscaled; ``plain``, GPT-2's E[w] + PE); ``tie``, the tables
    that share weights (``output``: the (decoder) input table and the output projection; ``src_tgt``:
    the source and target tables; ``all``: every tie the family has; ``none``); ``vocab_multiple``,
    the rows of a table and of the output projection rounded up to a multiple of it (64 suits a GPU's
    matrix products; 1 pads nothing). A family says which ties it has (its config's ``ties``)."""

    section: ClassVar[str] = "model.embeddings"

    kind: str = "scaled"
    tie: str = "all"
    vocab_multiple: int = 1

    def check(self) -> None:
        one_of("embeddings.kind", self.kind, EMBEDDINGS)
        one_of("embeddings.tie", self.tie, TIED)
        at_least("embeddings.vocab_multiple", self.vocab_multiple, 1)

    def tied(self, ties: tuple[str, ...]) -> tuple[str, ...]:
        """The ties in force where the family has ``ties``: a subset of ('output', 'src_tgt') ('all' is
        both where there are a source and a target table, 'output' where there is one)."""
        return tuple(tie for tie in TIED[self.tie] if tie in ties)

    def rows(self, vocab_size: int) -> int:
        """The rows of a token table and of the output projection: ``vocab_size`` rounded up to a
        multiple of ``vocab_multiple``."""
        return -(-vocab_size // self.vocab_multiple) * self.vocab_multiple


@dataclass(frozen=True)
class Positions(TypedConfig):
    """Where a Transformer family's tokens sit (``model.positions``): ``scheme``, applied where the
    method puts it: absolute encodings (``sinusoidal``, ``sinusoidal_halves``: Marian's layout of the
    same table, ``learned``) at the embeddings, relative ones (``relative``, ``relative_bias``,
    ``rotary``, ``alibi``) inside every self-attention, ``none`` nowhere; ``combine``, how an absolute
    vector meets the token's (``add``, or ``concat`` of a vector of width ``dim``, default d_model / 2);
    ``base``, the wavelengths' base of the sinusoids and of the rotations; ``max_relative_distance``,
    the clipped distance of Shaw et al.'s and T5's tables; ``max_len``, the positions a learned table
    has (and the longest sequence a model is built for). What spans other parts (the widths against
    d_model and the head size, the ties, the backend) the family's config checks. The recurrent and
    convolutional families hold one flattened with ``max_len`` alone, written ``model.max_len``
    (convs2s: ``learned``, its learnt positions; rnn: ``none``, max_len the positions of its location
    score)."""

    section: ClassVar[str] = "model.positions"

    scheme: str = "sinusoidal"
    combine: str = "add"
    dim: Optional[int] = None
    base: float = 10000.0
    max_relative_distance: int = 16
    max_len: int = 1024

    def check(self) -> None:
        one_of("positions.scheme", self.scheme, POSITIONAL)
        one_of("positions.combine", self.combine, POSITIONAL_COMBINE)
        at_least("positions.max_len", self.max_len, 1)
        at_least("positions.max_relative_distance", self.max_relative_distance, 1)
        if self.dim is not None:
            at_least("positions.dim", self.dim, 1)
        if self.base <= 1:
            raise ConfigError(f"positions.base must be > 1 (got {self.base})")
        if self.combine == "concat" and not self.absolute:
            raise ConfigError(
                f"positions.combine 'concat' needs an absolute encoding ('sinusoidal' or 'learned'), not '{self.scheme}'"
            )
        if self.combine != "concat" and self.dim is not None:
            raise ConfigError("positions.dim is only used with positions.combine 'concat'")

    @property
    def absolute(self) -> bool:
        """True where the scheme sits once at the embeddings, not inside every self-attention."""
        return POSITIONAL[self.scheme].absolute

    @property
    def max_positions(self) -> int | None:
        """The positions a learned table has; None: the scheme has no limit."""
        return self.max_len if self.scheme == "learned" else None

    def width(self, d_model: int) -> int:
        """Width of an absolute positional vector: d_model when added, ``dim`` (default d_model / 2)
        when concatenated."""
        if self.combine == "add":
            return d_model
        return self.dim if self.dim is not None else d_model // 2

    def token_width(self, d_model: int) -> int:
        """Width of a token embedding: what the positional vector leaves of d_model."""
        return d_model - (self.width(d_model) if self.combine == "concat" else 0)

    def check_widths(self, d_model: int, d_head: int) -> None:
        """The widths the scheme needs of a stack of width ``d_model`` and head size ``d_head``."""
        width = self.width(d_model)
        if self.combine == "concat" and not 1 <= width < d_model:
            raise ConfigError(
                f"positions.dim ({width}) must be between 1 and d_model - 1 ({d_model - 1}) when "
                f"positions.combine is 'concat'"
            )
        if self.scheme.startswith("sinusoidal") and width % 2:
            raise ConfigError(f"sinusoidal positions need an even width (got {width})")
        if self.scheme == "rotary" and d_head % 2:
            raise ConfigError(f"rotary positions need an even head size d_model / n_heads (got {d_head})")


class TransformerConfig(Protocol):
    """What every Transformer family's config offers (each declares these parts itself, before its
    own fields, and its family is a :class:`TransformerFamily`), one part per axis of variation.

    ``stack`` (StackConfig): the paper's base model by default (6 layers of 512, 8 heads, d_ff 2048,
    post-norm, ReLU). ``positions`` (Positions): the scheme and where it is applied: absolute encodings
    at the embeddings, added or concatenated (``positions.combine``), relative ones inside every
    self-attention. ``embeddings`` (TokenEmbeddings): how tokens and positions make the input, the
    ties between the tables (``embeddings.tie``: ``output``; the encoder-decoder and CMLM add
    ``src_tgt``, and ``all`` is both, the paper's choice), and the tables' row multiple. ``backends``:
    the attention backends' own options (nn/backends/).

    The ablation switches are the stack's (models/stack.py: ``stack.normalisation`` ``layer`` or
    ``none``, ``stack.residual``, ``stack.ffn``, ``stack.attention_scale``); ``positions.scheme: none`` and
    ``n_heads`` at a fixed d_model are the other two.
    """

    @property
    def stack(self) -> StackConfig: ...

    @property
    def positions(self) -> Positions: ...

    @property
    def embeddings(self) -> TokenEmbeddings: ...

    @property
    def backends(self) -> BackendOptions: ...

    @property
    def tied(self) -> tuple[str, ...]: ...


def transformer_parts(cfg: FamilyConfig) -> TransformerConfig:
    """``cfg`` as the Transformer parts it offers; a config without them is an internal error (a
    TransformerFamily whose config does not declare them)."""
    if not {"stack", "positions", "embeddings", "backends"} <= set(cfg.field_names()):
        raise TypeError(f"{type(cfg).__name__} lacks the Transformer parts (stack, positions, embeddings, backends)")
    return cast(TransformerConfig, cfg)


class TransformerFamily(ModelFamily):
    """The base of the Transformer families: the checks across the parts their configs share
    (:class:`TransformerConfig`) and the sizes derived from them. ``ties``: the values
    ``embeddings.tie`` may take in the family."""

    ties: ClassVar[tuple[str, ...]] = SINGLE_STACK_TIES

    @classmethod
    def check_config(cls, cfg: FamilyConfig) -> None:
        parts = transformer_parts(cfg)
        cls._check_ties(parts)
        if parts.stack.normalisation == "batch":
            raise ConfigError(
                "normalisation 'batch' standardises each feature over every token of a batch, which "
                "would count the padding of sequences of tokens; use 'layer' or 'none'"
            )
        parts.positions.check_widths(parts.stack.d_model, parts.stack.d_head)
        if parts.positions.combine == "concat" and "output" in parts.tied:
            raise ConfigError(
                "embeddings.tie 'output'/'all' needs token embeddings of width d_model; with "
                "positions.combine 'concat' use embeddings.tie 'none' or 'src_tgt'"
            )
        cls._check_backend(parts)

    @classmethod
    def check_config_shape(cls, cfg: FamilyConfig, shape: DataShape) -> None:
        parts = transformer_parts(cfg)
        if "src_tgt" in parts.tied and shape.src_vocab_size not in (None, shape.vocab_size):
            raise ConfigError(
                f"embeddings.tie '{parts.embeddings.tie}' shares source and target embeddings, so "
                f"src_vocab_size ({shape.src_vocab_size}) must equal vocab_size ({shape.vocab_size}); "
                f"use embeddings.tie 'output' or 'none' for separate vocabularies"
            )

    @classmethod
    def max_positions(cls, cfg: FamilyConfig) -> int | None:
        return transformer_parts(cfg).positions.max_positions

    @classmethod
    def longest_sequence(cls, cfg: FamilyConfig) -> int | None:
        return transformer_parts(cfg).positions.max_len

    @classmethod
    def tied(cls, cfg: FamilyConfig) -> tuple[str, ...]:
        """The ties in force: a subset of ('output', 'src_tgt'), the ones the family has (``ties``)."""
        return transformer_parts(cfg).embeddings.tied(cls.ties)

    @classmethod
    def _check_ties(cls, parts: TransformerConfig) -> None:
        if parts.embeddings.tie == "src_tgt" and "src_tgt" not in cls.ties:
            raise ConfigError(f"embeddings.tie 'src_tgt' needs arch 'encoder_decoder' (arch is '{cls.name}')")
        one_of("embeddings.tie", parts.embeddings.tie, cls.ties)

    @classmethod
    def _check_backend(cls, parts: TransformerConfig) -> None:
        """What the chosen backend supports, as it declares it (nn/backends/)."""
        cls.check_stack(parts.stack)
        backend = ATTENTION_BACKENDS[parts.stack.attention_backend]
        defaults = BackendOptions()
        for other in ATTENTION_BACKENDS.values():
            for path in other.fields:
                if path not in backend.fields and parts.backends.option(path) != defaults.option(path):
                    users = [b.name for b in ATTENTION_BACKENDS.values() if path in b.fields]
                    raise ConfigError(
                        f"backends.{path} is only used with attention_backend "
                        f"{' or '.join(map(repr, users))} (attention_backend is '{backend.name}')"
                    )
        scheme = parts.positions.scheme
        if scheme == "relative" and not backend.returns_weights:
            forming = [b.name for b in ATTENTION_BACKENDS.values() if b.returns_weights]
            raise ConfigError(
                f"positions.scheme 'relative' (Shaw et al.) weights a value term by the attention "
                f"probabilities, which only attention_backend {' or '.join(map(repr, forming))} forms "
                f"(got '{backend.name}')"
            )
        if POSITIONAL[scheme].biases_scores and not backend.score_bias:
            raise ConfigError(
                f"attention_backend '{backend.name}' never forms scores, so positions.scheme "
                f"'{scheme}' has nothing to add its bias to; use 'rotary', 'sinusoidal' or "
                f"'learned'"
            )
