"""The attention stack's config: the fields of N identical layers of attention and feed-forward
that every family built on them shares (``StackConfig``: layers, heads, widths, norm placement,
activation, dropout, backend), and what a family adds around it (``AttentionStack``: which backends
fit it, the ablation switches it does not vary).

A family's config holds one ``stack`` with its own defaults, and declares none of its fields:

    stack: StackConfig = StackConfig(d_model=192, n_heads=3, n_layers=12, d_ff=768, activation="gelu", norm="pre")

In a config file the stack is a mapping whose fields override the family's defaults one by one
(``model: {arch: vit, stack: {n_layers: 4}}`` keeps ViT's other defaults); on the command line,
``--set model.stack.n_layers=4``.
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
    base model; a family gives its own."""

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

    def __post_init__(self) -> None:
        self._check_types()
        one_of("activation", self.activation, ACTIVATIONS)
        one_of("norm", self.norm, NORM_PLACEMENTS)
        one_of("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
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


def stack_of(cfg: Any) -> StackConfig | None:
    """A family config's attention stack; None for a family without one (recurrent, convolutional)."""
    return cfg.stack if isinstance(cfg, AttentionStack) else None


def fields_free_exact(backend: type[AttentionBackend]) -> bool:
    """The exact backends with no fields of their own: what a short sequence (an image's patches, a
    series' patches) needs, where the blockwise and approximate ones only add choices."""
    return backend.exact and not backend.fields


def explicit_masks(backend: type[AttentionBackend]) -> bool:
    """The backends that take an explicit (Tq, Tk) mask besides padding and causality."""
    return backend.takes_explicit_mask


class AttentionStack:
    """Mixed into the config of every family with an attention stack (its dataclass declares
    ``stack: StackConfig``): which backends fit the family, and the ablation switches, which only
    the Transformer families make fields of."""

    stack: StackConfig

    # What the family needs of its attention backend, as the backends declare what they have
    # (nn/backends/): a predicate, and why another backend does not fit. Any backend by default; a
    # family restricts them by setting these two (e.g. ``backends_fit = fields_free_exact``).
    backends_fit: ClassVar[Callable[[type[AttentionBackend]], bool]] = staticmethod(lambda backend: True)
    backends_refusal: ClassVar[str] = ""

    def check_stack(self) -> None:
        """The ablation switches name what they may, and the stack's ``attention_backend`` is one that
        fits the family (``backends_fit``)."""
        one_of("normalisation", self.normalisation, NORMALISATIONS)
        one_of("attention_scale", self.attention_scale, ATTENTION_SCALES)
        if not self.backends_fit(ATTENTION_BACKENDS[self.stack.attention_backend]):
            fitting = [name for name, backend in ATTENTION_BACKENDS.items() if self.backends_fit(backend)]
            raise ConfigError(f"attention_backend '{self.stack.attention_backend}' {self.backends_refusal}; use "
                              f"{' or '.join(map(repr, fitting))}")

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
