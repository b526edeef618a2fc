"""One vector for a whole sequence, from its (B, T, d_model) states and (B, T) real positions."""

from __future__ import annotations

from torch import Tensor, nn


class FirstTokenPooling(nn.Module):
    """BERT's summary of a sequence: the vector at the first position (the [CLS] token)."""

    def forward(self, h: Tensor, valid: Tensor) -> Tensor:
        """(B, T, d_model), (B, T) -> (B, d_model)."""
        return h[:, 0]


class FirstTwoPooling(nn.Module):
    """DeiT's and the AST's summary: the mean of the vectors at the first two positions (the class
    token's and the distillation token's)."""

    def forward(self, h: Tensor, valid: Tensor) -> Tensor:
        """(B, T, d_model), (B, T) -> (B, d_model)."""
        return (h[:, 0] + h[:, 1]) / 2


class MeanPooling(nn.Module):
    """The mean of the vectors at real (non-padding) positions (Sentence-BERT's summary)."""

    def forward(self, h: Tensor, valid: Tensor) -> Tensor:
        """(B, T, d_model), (B, T) -> (B, d_model)."""
        weights = valid.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        return (h * weights).sum(1) / weights.sum(1).clamp(min=1.0)
