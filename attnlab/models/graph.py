"""The graph family: the Graph Transformer of Dwivedi & Bresson (2021) for node classification
(nn/graph.py), built from the Transformer's encoder layers (models/transformer.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import nn

from attnlab.config import at_least, one_of
from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, FamilyConfig, ModelFamily, register_family
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.graph import GraphTransformer, LaplacianPositionalEncoding
from attnlab.nn.layers import EncoderLayer
from attnlab.nn.registry import ACTIVATIONS, ATTENTION_BACKENDS, NORM_PLACEMENTS
from attnlab.nn.transformer import Encoder


@dataclass(frozen=True)
class GraphConfig(FamilyConfig):
    """``n_features`` and ``n_classes`` are set by the data; ``laplacian_k``: how many Laplacian
    eigenvectors are a node's position (0: none). The encoder fields mean what they mean for the
    Transformer families; ``attention_backend`` must take an explicit mask (the neighbourhoods)."""

    n_features: int
    n_classes: int = 2
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 128
    dropout: float = 0.1
    attention_dropout: Optional[float] = None
    activation: str = "relu"
    norm: str = "pre"
    layer_norm_eps: float = 1e-5
    laplacian_k: int = 8
    attention_backend: str = "auto"

    def check(self) -> None:
        one_of("activation", self.activation, ACTIVATIONS)
        one_of("norm", self.norm, NORM_PLACEMENTS)
        for name in ("n_features", "d_model", "n_heads", "n_layers", "d_ff"):
            at_least(name, getattr(self, name), 1)
        at_least("n_classes", self.n_classes, 2)
        at_least("laplacian_k", self.laplacian_k, 0)
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1) (got {value})")
        if self.layer_norm_eps <= 0:
            raise ConfigError(f"layer_norm_eps must be > 0 (got {self.layer_norm_eps})")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        self._check_backend()

    def _check_backend(self) -> None:
        """Neighbourhoods are an explicit mask: only the backends that declare they take one."""
        one_of("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        if not ATTENTION_BACKENDS[self.attention_backend].takes_explicit_mask:
            taking = [name for name, b in ATTENTION_BACKENDS.items() if b.takes_explicit_mask]
            raise ConfigError(f"attention_backend '{self.attention_backend}' takes no explicit mask, which arch "
                              f"'graph' attends through (each node's neighbourhood); use "
                              f"{' or '.join(map(repr, taking))}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def attn_dropout(self) -> float:
        return self.dropout if self.attention_dropout is None else self.attention_dropout


@register_family
class GraphFamily(ModelFamily):
    name = "graph"
    config = GraphConfig
    # encoder/decoder mean reading and writing token sequences: a graph model does neither
    capabilities = Capabilities(encoder=False, decoder=False, incremental_decoding=False, attention_weights=True,
                                inputs="graph")

    @staticmethod
    def build(cfg: GraphConfig) -> GraphTransformer:
        positions = LaplacianPositionalEncoding(cfg.laplacian_k, cfg.d_model) if cfg.laplacian_k else None
        model = GraphTransformer(nn.Linear(cfg.n_features, cfg.d_model), positions, cfg.dropout, encoder(cfg),
                                 nn.Linear(cfg.d_model, cfg.n_classes))
        parts.init_weights(model)
        return model


def encoder(cfg: GraphConfig) -> Encoder:
    """The Transformer's encoder layers (feed-forward, residual blocks and norms from the same part
    builders), whose self-attention has no positional hooks: nodes have no sequence positions, and
    a node's place in the graph enters at the input, with its Laplacian eigenvectors."""
    def attention() -> MultiHeadAttention:
        return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, backend=parts.backend(cfg, cross=False))

    layers = [EncoderLayer(attention(), parts.feed_forward(cfg), parts.residual(cfg), parts.residual(cfg))
              for _ in range(cfg.n_layers)]
    return Encoder(layers, parts.final_norm(cfg))
