"""The graph family: the Graph Transformer of Dwivedi & Bresson (2021) for node classification
(nn/graph.py), built from the Transformer's encoder layers (models/transformer.py)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from attnlab.config import at_least
from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, FamilyConfig, Inputs, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig, explicit_masks
from attnlab.nn.graph import GraphTransformer, LaplacianPositionalEncoding


@dataclass(frozen=True)
class GraphConfig(FamilyConfig):
    """The node features and classes are the data's (DataShape: ``n_features``, ``n_classes``); ``laplacian_k``: how many Laplacian
    eigenvectors are a node's position (0: none). The encoder fields mean what they mean for the
    Transformer families; ``attention_backend`` must take an explicit mask (the neighbourhoods)."""

    stack: StackConfig = StackConfig(d_model=64, n_heads=4, n_layers=2, d_ff=128, norm="pre")
    laplacian_k: int = 8

    def check(self) -> None:
        self.family.check_stack(self.stack)
        at_least("laplacian_k", self.laplacian_k, 0)


@register_family
class GraphFamily(ModelFamily):
    name = "graph"
    config = GraphConfig
    # encoder/decoder mean reading and writing token sequences: a graph model does neither
    capabilities = Capabilities(
        encoder=False, decoder=False, incremental_decoding=False, attention_weights=True, inputs=Inputs.GRAPH
    )
    backends_fit = explicit_masks  # a function read from the class: no self
    backends_refusal = "takes no explicit mask, which arch 'graph' attends through (each node's neighbourhood)"

    @staticmethod
    def build(cfg: GraphConfig, shape: DataShape) -> GraphTransformer:
        positions = LaplacianPositionalEncoding(cfg.laplacian_k, cfg.stack.d_model) if cfg.laplacian_k else None
        model = GraphTransformer(
            nn.Linear(shape.need("n_features", "arch 'graph'"), cfg.stack.d_model),
            positions,
            cfg.stack.dropout,
            parts.plain_encoder(cfg, cfg.stack.n_layers),
            nn.Linear(cfg.stack.d_model, shape.need("n_classes", "arch 'graph'")),
        )
        parts.init_weights(model)
        return model
