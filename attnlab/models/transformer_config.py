"""The Transformer families' config: the fields of the blocks (attention, positions, feed-forward,
residual and norm) that the three Transformer families share, and the checks of the attention stack
that every family built on it shares (``AttentionStack``). The builders that turn them into
modules are in models/transformer.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional

from attnlab.config import at_least, one_of
from attnlab.errors import ConfigError
from attnlab.models.family import FamilyConfig
from attnlab.nn.backends import AttentionBackend
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.registry import (
    ACTIVATIONS,
    ATTENTION_BACKENDS,
    ATTENTION_SCALES,
    NORM_PLACEMENTS,
    NORMALISATIONS,
    POSITIONAL,
    POSITIONAL_COMBINE,
)

EMBEDDINGS = ("scaled", "normed", "plain")  # E sqrt(D) + PE (Vaswani et al.), LayerNorm(E + PE + S) (BERT), E + PE (GPT-2)
SINGLE_STACK_TIES = ("none", "output", "all")  # 'all' = 'output' where there is one embedding table


def fields_free_exact(backend: type[AttentionBackend]) -> bool:
    """The exact backends with no fields of their own: what a short sequence (an image's patches, a
    series' patches) needs, where the blockwise and approximate ones only add choices."""
    return backend.exact and not backend.fields


def explicit_masks(backend: type[AttentionBackend]) -> bool:
    """The backends that take an explicit (Tq, Tk) mask besides padding and causality."""
    return backend.takes_explicit_mask


class AttentionStack:
    """What every family built on attnlab's attention stack shares besides its own fields: the
    checks of d_model, n_heads, n_layers, d_ff, the two dropouts, activation, norm placement and
    layer_norm_eps, and the sizes they give. A mixin: each family declares those fields, with its
    own defaults (the Transformer's, ViT's, the Graph Transformer's)."""

    def check_stack(self) -> None:
        one_of("activation", self.activation, ACTIVATIONS)
        one_of("norm", self.norm, NORM_PLACEMENTS)
        one_of("normalisation", self.normalisation, NORMALISATIONS)
        one_of("attention_scale", self.attention_scale, ATTENTION_SCALES)
        for name in ("d_model", "n_heads", "n_layers", "d_ff"):
            at_least(name, getattr(self, name), 1)
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1) (got {value})")
        if self.layer_norm_eps <= 0:
            raise ConfigError(f"layer_norm_eps must be > 0 (got {self.layer_norm_eps})")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")

    # What the family needs of its attention backend, as the backends declare what they have
    # (nn/backends/): a predicate, and why another backend does not fit. Any backend by default; a
    # family restricts them by setting these two (e.g. ``backends_fit = fields_free_exact``).
    backends_fit: ClassVar[Callable[[type[AttentionBackend]], bool]] = staticmethod(lambda backend: True)
    backends_refusal: ClassVar[str] = ""

    def check_backend(self) -> None:
        """``attention_backend`` names a backend, one that fits the family (``backends_fit``)."""
        one_of("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        if not self.backends_fit(ATTENTION_BACKENDS[self.attention_backend]):
            fitting = [name for name, backend in ATTENTION_BACKENDS.items() if self.backends_fit(backend)]
            raise ConfigError(f"attention_backend '{self.attention_backend}' {self.backends_refusal}; use "
                              f"{' or '.join(map(repr, fitting))}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    # The ablation switches (Transformer families: fields; other families: the paper's architecture)
    @property
    def normalisation(self) -> str:
        """What the residual blocks normalise with (nn/registry.py NORMALISATIONS): LayerNorm, unless
        a family declares a field of this name."""
        return "layer"

    @property
    def residual(self) -> bool:
        """Residual sums around the sublayers."""
        return True

    @property
    def ffn(self) -> bool:
        """A position-wise feed-forward sublayer in every layer."""
        return True

    @property
    def attention_scale(self) -> str:
        """What multiplies q . k (nn/registry.py ATTENTION_SCALES): 1 / sqrt(d_k)."""
        return "sqrt_dk"

    @property
    def attn_dropout(self) -> float:
        return self.dropout if self.attention_dropout is None else self.attention_dropout


@dataclass(frozen=True)
class TransformerConfig(FamilyConfig, AttentionStack):
    """The fields of every Transformer family, one per axis of variation.

    ``positional`` is applied where the method puts it: absolute encodings (``sinusoidal``,
    ``sinusoidal_halves``: Marian's layout of the same table, ``learned``) at the embeddings, added or
    concatenated (``positional_combine``); relative ones
    (``relative``, ``relative_bias``, ``rotary``, ``alibi``) inside every self-attention.
    ``embedding``: ``scaled``, the paper's E[w] sqrt(D) + PE; ``normed``, BERT's LayerNorm(E[w] + PE
    + segment), unscaled; or ``plain``, GPT-2's E[w] + PE. ``tie_embeddings``: ``output`` ties the (decoder) input embedding to the output projection;
    the encoder-decoder adds ``src_tgt`` (shared source and target embeddings) and ``all`` (both,
    the paper's choice).

    The ablation switches (the paper's architecture by default): ``normalisation`` ``layer`` or
    ``none``; ``residual: false``, no residual sums; ``ffn: false``, no feed-forward sublayers;
    ``attention_scale``, what multiplies q . k: ``sqrt_dk`` (1 / sqrt(d_k)), ``none`` (1) or
    ``learned`` (one scalar per attention module, from 1 / sqrt(d_k)). ``positional: none`` and
    ``n_heads`` at a fixed d_model are the other two.
    """

    vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    n_layers: int = 6
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
    embedding: str = "scaled"
    attention_backend: str = "auto"
    attention_window: int = 128
    attention_block: int = 128
    attention_key_block: int = 1024
    sparse_stride: int = 0
    sparse_global: int = 0
    sparse_random: int = 0
    linear_features: str = "elu"
    linear_n_features: int = 64
    normalisation: str = "layer"
    residual: bool = True
    ffn: bool = True
    attention_scale: str = "sqrt_dk"
    vocab_multiple: int = 1

    ties = SINGLE_STACK_TIES  # the values tie_embeddings may take in this family
    positional_schemes: ClassVar[dict[str, type[PositionalEncoding]]] = POSITIONAL  # what ``positional`` may name

    def check(self) -> None:
        one_of("positional", self.positional, POSITIONAL)
        one_of("positional_combine", self.positional_combine, POSITIONAL_COMBINE)
        one_of("embedding", self.embedding, EMBEDDINGS)
        self._check_ties()
        self.check_stack()
        if self.normalisation == "batch":
            raise ConfigError("normalisation 'batch' standardises each feature over every token of a batch, which "
                              "would count the padding of sequences of tokens; use 'layer' or 'none'")
        for name in ("vocab_size", "max_len", "max_relative_distance", "vocab_multiple"):
            at_least(name, getattr(self, name), 1)
        if self.positional_dim is not None:
            at_least("positional_dim", self.positional_dim, 1)
        if self.positional_base <= 1:
            raise ConfigError(f"positional_base must be > 1 (got {self.positional_base})")
        self._check_positional()
        self._check_backend()
        if not 0 <= self.pad_id < min(self.vocab_sizes):
            raise ConfigError(f"pad_id ({self.pad_id}) must be a token id below the vocabulary size "
                              f"({min(self.vocab_sizes)})")

    def _check_ties(self) -> None:
        if self.tie_embeddings == "src_tgt" and "src_tgt" not in self.ties:
            raise ConfigError(f"tie_embeddings 'src_tgt' needs arch 'encoder_decoder' (arch is '{self.arch}')")
        one_of("tie_embeddings", self.tie_embeddings, self.ties)

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
        if self.positional.startswith("sinusoidal") and self.positional_width % 2:
            raise ConfigError(f"sinusoidal positions need an even width (got {self.positional_width})")
        if self.positional == "rotary" and self.d_head % 2:
            raise ConfigError(f"rotary positions need an even head size d_model / n_heads (got {self.d_head})")

    def _check_backend(self) -> None:
        """What the chosen backend supports, as it declares it (nn/backends/)."""
        self.check_backend()
        one_of("linear_features", self.linear_features, ("elu", "favor"))
        for name in ("attention_block", "attention_key_block", "linear_n_features"):
            at_least(name, getattr(self, name), 1)
        for name in ("attention_window", "sparse_stride", "sparse_global", "sparse_random"):
            at_least(name, getattr(self, name), 0)
        backend = ATTENTION_BACKENDS[self.attention_backend]
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for other in ATTENTION_BACKENDS.values():
            for name in other.fields:
                if name not in backend.fields and getattr(self, name) != defaults[name]:
                    users = [b.name for b in ATTENTION_BACKENDS.values() if name in b.fields]
                    raise ConfigError(f"{name} is only used with attention_backend {' or '.join(map(repr, users))} "
                                      f"(attention_backend is '{backend.name}')")
        if self.positional == "relative" and not backend.returns_weights:
            forming = [b.name for b in ATTENTION_BACKENDS.values() if b.returns_weights]
            raise ConfigError(f"positional 'relative' (Shaw et al.) weights a value term by the attention "
                              f"probabilities, which only attention_backend {' or '.join(map(repr, forming))} forms "
                              f"(got '{backend.name}')")
        if POSITIONAL[self.positional].biases_scores and not backend.score_bias:
            raise ConfigError(f"attention_backend '{backend.name}' never forms scores, so positional "
                              f"'{self.positional}' has nothing to add its bias to; use 'rotary', 'sinusoidal' or "
                              f"'learned'")
        if self.attention_scale != "sqrt_dk" and not backend.score_bias:
            raise ConfigError(f"attention_backend '{backend.name}' never forms scores, so attention_scale "
                              f"'{self.attention_scale}' has nothing to scale; use 'sqrt_dk'")
        if self.attn_dropout > 0 and not backend.attention_dropout:
            raise ConfigError(f"attention_backend '{backend.name}' has no attention probabilities to drop; set "
                              f"attention_dropout: 0 (the residual dropout stays at {self.dropout})")

    # -- derived quantities, so that no module recomputes them ------------------------------------
    @property
    def max_positions(self) -> int | None:
        return self.max_len if self.positional == "learned" else None

    @property
    def vocab_sizes(self) -> tuple[int, ...]:
        """Every embedding table's size (the pad id must be a token of each)."""
        return (self.vocab_size,)

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
        return () if self.tie_embeddings == "none" else ("output",)
