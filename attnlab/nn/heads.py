"""Output heads: the projection to the vocabulary, multi-token prediction's extra heads, and BERT's
masked-LM and classification heads."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.nn.dropout import Dropout


class VocabularyProjection(nn.Linear):
    """The pre-softmax map d_model -> V (without a bias unless asked), whose weight may have rows past V: a vocabulary
    padded to a multiple of 64 gives the matrix products aligned shapes on a GPU. The padded
    columns of the product are cut off here, so no softmax, loss or search ever sees them, and
    they get no gradient. ``never`` lists token ids that are never an output: their logits are
    -inf (the control tokens a pretrained model's vocabulary did not have, so that its distribution
    over its own tokens is unchanged). ``bias``: a bias per token (Marian's final_logits_bias)."""

    excluded: Tensor | None  # a buffer: (V,) bool, or None without ``never``

    def __init__(
        self, d_model: int, rows: int, vocab_size: int, never: tuple[int, ...] = (), bias: bool = False
    ) -> None:
        super().__init__(d_model, rows, bias=bias)
        self.vocab_size = vocab_size
        excluded = torch.zeros(vocab_size, dtype=torch.bool)
        excluded[list(never)] = True
        self.register_buffer("excluded", excluded if never else None, persistent=False)  # (V,)

    def forward(self, h: Tensor) -> Tensor:
        """(..., d_model) -> (..., V) logits."""
        return vocabulary_logits(super().forward(h), self.vocab_size, self.excluded)


def vocabulary_logits(products: Tensor, vocab_size: int, excluded: Tensor | None) -> Tensor:
    """A vocabulary projection's (..., rows) products -> (..., V) logits: the padding rows cut off,
    the never-output tokens (``excluded``, (V,) bool, or None) at -inf. Shared by every weights
    kind of the projection (decode/weights.py's int8 one)."""
    logits = products[..., :vocab_size]  # (..., rows) -> (..., V)
    return logits if excluded is None else logits.masked_fill(excluded, -torch.inf)


class MaskedLMHead(nn.Module):
    """BERT's prediction head: logits = W_out LayerNorm(act(W h + b)) + b_out, W_out tied to the
    embeddings, b_out one bias per word."""

    def __init__(self, d_model: int, activation: nn.Module, eps: float, projection: VocabularyProjection) -> None:
        super().__init__()
        self.transform = nn.Linear(d_model, d_model)
        self.activation = activation
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.projection = projection
        self.bias = nn.Parameter(torch.zeros(projection.vocab_size))

    def forward(self, h: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, V)."""
        return self.projection(self.norm(self.activation(self.transform(h)))) + self.bias


class MultiTokenHead(nn.Module):
    """An extra output head of multi-token prediction (Gloeckle et al. 2024): the trunk's state at
    position t through a pre-norm residual feed-forward block, h + FFN(LayerNorm(h)), which the
    shared output projection reads as token t + 1 + j. (Gloeckle et al. give each head a whole
    Transformer layer; a feed-forward block, Medusa's head (Cai et al. 2024), keeps no cache of its
    own, so a draft from the heads costs no extra pass when decoding.)"""

    def __init__(self, ffn: nn.Module, residual: nn.Module) -> None:
        super().__init__()
        self.ffn, self.residual = ffn, residual

    def forward(self, h: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        return self.residual(h, self.ffn)


class ClassificationHead(nn.Module):
    """BERT's pooler and classifier: logits = W_c Dropout(tanh(W_p pool(h) + b_p)) + b_c."""

    def __init__(self, d_model: int, n_classes: int, dropout: float, pooling: nn.Module) -> None:
        super().__init__()
        self.pooling = pooling
        self.pool = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)
        self.out = nn.Linear(d_model, n_classes)

    def forward(self, h: Tensor, valid: Tensor) -> Tensor:
        """(B, T, d_model), (B, T) True at real tokens -> (B, n_classes)."""
        return self.out(self.dropout(torch.tanh(self.pool(self.pooling(h, valid)))))
