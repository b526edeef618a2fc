"""The Graph Transformer for node classification (Dwivedi & Bresson 2021, "A Generalization of
Transformer Networks to Graphs"): Transformer encoder layers whose attention is restricted to each
node's neighbourhood, with Laplacian eigenvectors as the nodes' positions.

    h_i^0  = A^0 alpha_i + a^0  +  C^0 lambda_i + c^0     input features and Laplacian positional encoding
    h^l    = EncoderLayer(h^{l-1}), node i attending over j in N(i) u {i}
    y_i    = W_c h_i^L + b_c                              one class score per class, per node

The whole graph is one sequence of N nodes (B = 1); the neighbourhoods are the explicit attention
mask. Unlike the paper, each node also attends to itself (so an isolated node keeps its own
vector), and the layers are attnlab's LayerNorm residual blocks rather than BatchNorm ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.dropout import Dropout
from attnlab.nn.layers import Encoder
from attnlab.nn.tensor_plan import TensorPlan, megatron


def normalized_laplacian(adjacency: Tensor) -> Tensor:
    """(N, N) symmetric boolean adjacency without self-loops -> L = I - D^-1/2 A D^-1/2 (N, N),
    in float64. An isolated node has no D^-1/2; it is taken as 0, so its row of L is the identity's
    (an eigenvector of eigenvalue 1 that is non-zero on that node alone)."""
    a = adjacency.to(torch.float64)
    degree = a.sum(1)  # (N,)
    d = torch.where(degree > 0, degree.clamp(min=1.0).rsqrt(), 0.0)  # (N,) D^-1/2
    return torch.eye(len(a), dtype=a.dtype, device=a.device) - d[:, None] * a * d[None, :]


def laplacian_eigenvectors(adjacency: Tensor) -> Tensor:
    """(N, N) adjacency -> (N, N - 1) float32: the unit eigenvectors of the normalised Laplacian,
    by ascending eigenvalue, less the first (eigenvalue 0: D^1/2 1 on a connected graph, which says
    nothing about a node's place). Computed once per graph; a model takes the first k columns.
    Each sign is arbitrary, and so is the basis within a repeated eigenvalue (a cycle's pairs). On a
    graph of c components, the first c eigenvalues are all 0 and the paper drops one, as here."""
    _, eigenvectors = torch.linalg.eigh(normalized_laplacian(adjacency))  # (N, N), columns by ascending eigenvalue
    return eigenvectors[:, 1:].to(torch.float32)


def neighbourhoods(adjacency: Tensor) -> Tensor:
    """(N, N) boolean adjacency -> (1, 1, N, N) attention mask: node i may attend to node j when j
    is its neighbour or j = i."""
    self_loops = torch.eye(len(adjacency), dtype=torch.bool, device=adjacency.device)
    return (adjacency | self_loops)[None, None]


class LaplacianPositionalEncoding(nn.Module):
    """lambda_i^0 = C^0 lambda_i + c^0: node i's entries of the k eigenvectors of smallest non-trivial
    eigenvalue, mapped to d_model. In training each eigenvector's sign is flipped at random in every
    forward pass, as Dwivedi & Bresson do: the sign is arbitrary, so the model must not learn it.
    A graph with no more than k nodes has only N - 1 of them; the missing columns are zeros (their
    code pads the same way)."""

    def __init__(self, k: int, d_model: int) -> None:
        super().__init__()
        self.k = k
        self.proj = nn.Linear(k, d_model)

    def forward(self, eigenvectors: Tensor) -> Tensor:
        """(N, m) eigenvectors by ascending eigenvalue (laplacian_eigenvectors) -> (N, d_model)."""
        lam = eigenvectors[:, : self.k]  # (N, min(m, k))
        lam = F.pad(lam, (0, self.k - lam.shape[1]))  # (N, k)
        if self.training:
            signs = torch.randint(0, 2, (self.k,), device=lam.device).to(lam.dtype) * 2 - 1  # (k,) of +-1
            lam = lam * signs
        return self.proj(lam)


class GraphTransformer(nn.Module):
    """``model(features, adjacency, eigenvectors)`` -> (N, n_classes) class logits of every node.

    features: (N, F) node features alpha_i; adjacency: (N, N) boolean, symmetric, no self-loops;
    eigenvectors: (N, m) from :func:`laplacian_eigenvectors` (unread when ``positions`` is None)."""

    def __init__(
        self,
        feature_embedding: nn.Linear,
        positions: LaplacianPositionalEncoding | None,
        dropout: float,
        encoder: Encoder,
        classifier: nn.Linear,
    ) -> None:
        super().__init__()
        self.feature_embedding, self.positions = feature_embedding, positions
        self.dropout = Dropout(dropout)
        self.encoder, self.classifier = encoder, classifier

    def encode(self, features: Tensor, adjacency: Tensor, eigenvectors: Tensor) -> Tensor:
        """-> (N, d_model) node vectors h^L."""
        h = self.feature_embedding(features)  # (N, d_model): A^0 alpha_i + a^0
        if self.positions is not None:
            h = h + self.positions(eigenvectors)  # + C^0 lambda_i + c^0
        n = len(features)
        every_node = torch.ones(1, n, dtype=torch.bool, device=h.device)  # (1, N): no padding
        nodes = torch.arange(n, device=h.device)  # (N,): the encoder's positions; no positional scheme reads them
        h = self.encoder(self.dropout(h)[None], every_node, nodes, neighbourhoods(adjacency))  # (1, N, d_model)
        return h[0]

    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of the encoder's layers (train.strategy tp, nn/tensor_plan.py)."""
        return megatron(self, "encoder")

    def forward(self, features: Tensor, adjacency: Tensor, eigenvectors: Tensor) -> Tensor:
        return self.classifier(self.encode(features, adjacency, eigenvectors))  # (N, n_classes)
