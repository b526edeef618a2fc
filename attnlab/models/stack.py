"""The attention stack's config: the fields of N identical layers of attention and feed-forward
that every family built on them shares (``StackConfig``: layers, heads, widths, norm placement,
activation, dropout, backend, the ablation switches of its blocks). Which backends fit a family is
the family's (models/family.py: ``ModelFamily.backends_fit``).

A family's config holds one ``stack`` with its own defaults, and declares none of its fields:

    stack: StackConfig = StackConfig(d_model=192, n_heads=3, n_layers=12, d_ff=768, activation="gelu", norm="pre")

In a config file the stack is a mapping whose fields override the family's defaults one by one
(``model: {arch: vit, stack: {n_layers: 4}}`` keeps ViT's other defaults); on the command line,
``--set model.stack.n_layers=4``.

A recurrent or convolutional family (models/rnn.py, convs2s.py, cnn.py) holds one too, for N layers
of width d_model with dropout alone, composed flattened (config.flattened): those fields are written
in its section (``model.d_model``), the others stay at defaults that no width refuses (one head), and
it is no attention stack (:func:`stack_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

from attnlab.config import TypedConfig, at_least, one_of
from attnlab.errors import ConfigError
from attnlab.nn.backends import AttentionBackend
from attnlab.nn.registry import ACTIVATIONS, ATTENTION_BACKENDS, ATTENTION_SCALES, NORM_PLACEMENTS, NORMALISATIONS


@dataclass(frozen=True)
class StackConfig(TypedConfig):
    """N layers of width d_model: n_heads heads of d_model / n_heads, a feed-forward of d_ff with
    ``activation``, residual ``dropout`` (``attention_dropout`` on the attention probabilities; None:
    ``dropout``), the norm ``pre`` or ``post`` its sublayer with ``layer_norm_eps``, and the
    ``attention_backend`` that computes the attention (nn/backends/). The defaults are the paper's
    base model; a family gives its own.

    The ablation switches change the blocks of the stack (the paper's architecture by default):
    ``normalisation``, what the residual blocks normalise with (``layer``, ``batch``: a BatchNorm
    over the tokens, or ``none``); ``residual: false``, no residual sums; ``ffn: false``, no
    feed-forward sublayers; ``attention_scale``, what multiplies q . k: ``sqrt_dk`` (1 / sqrt(d_k)),
    ``none`` (1) or ``learned`` (one scalar per attention module, from 1 / sqrt(d_k))."""

    section: ClassVar[str] = "model.stack"

    d_model: int = 512
    n_heads: int = 8
    n_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: Optional[float] = None
    activation: str = "relu"
    norm: str = "post"
    layer_norm_eps: float = 1e-5
    attention_backend: str = "auto"
    normalisation: str = "layer"
    residual: bool = True
    ffn: bool = True
    attention_scale: str = "sqrt_dk"

    def check(self) -> None:
        one_of("activation", self.activation, ACTIVATIONS)
        one_of("norm", self.norm, NORM_PLACEMENTS)
        one_of("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
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

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def attn_dropout(self) -> float:
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    def check_backend(self, fits: Callable[[type[AttentionBackend]], bool], refusal: str) -> None:
        """That ``attention_backend`` is one that ``fits`` the family (its ``backends_fit``,
        models/family.py), else refused with ``refusal`` listing those that fit; and that it forms
        the scores that ``attention_scale`` scales and the probabilities that attention dropout drops."""
        backend = ATTENTION_BACKENDS[self.attention_backend]
        if not fits(backend):
            fitting = [name for name, other in ATTENTION_BACKENDS.items() if fits(other)]
            raise ConfigError(
                f"attention_backend '{self.attention_backend}' {refusal}; use {' or '.join(map(repr, fitting))}"
            )
        if self.attention_scale != "sqrt_dk" and not backend.score_bias:
            raise ConfigError(
                f"attention_backend '{backend.name}' never forms scores, so attention_scale "
                f"'{self.attention_scale}' has nothing to scale; use 'sqrt_dk'"
            )
        if self.attn_dropout > 0 and not backend.attention_dropout:
            raise ConfigError(
                f"attention_backend '{backend.name}' has no attention probabilities to drop; set "
                f"attention_dropout: 0 (the residual dropout stays at {self.dropout})"
            )


def stack_of(cfg: Any) -> StackConfig | None:
    """A family config's attention stack, the part its section writes as ``model.stack``; None for a
    family without one. Asked of the keys that the family's section has (``field_names``), as
    ``transformer_parts`` (models/transformer_config.py) asks for the Transformer parts, not of an
    attribute: a recurrent or convolutional family holds a StackConfig flattened (config.flattened)
    for its width, depth and dropout alone, written ``model.d_model``, and has no attention stack."""
    if not isinstance(cfg, TypedConfig) or "stack" not in cfg.field_names():
        return None
    stack = getattr(cfg, "stack", None)
    return stack if isinstance(stack, StackConfig) else None


def fields_free_exact(backend: type[AttentionBackend]) -> bool:
    """The exact backends with no fields of their own: what a short sequence (an image's patches, a
    series' patches) needs, where the blockwise and approximate ones only add choices."""
    return backend.exact and not backend.fields


def explicit_masks(backend: type[AttentionBackend]) -> bool:
    """The backends that take an explicit (Tq, Tk) mask besides padding and causality."""
    return backend.takes_explicit_mask
