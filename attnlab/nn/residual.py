"""Residual connection with normalisation, in either placement.

post (the paper):  x_out = Norm(x + Dropout(Sublayer(x)))
pre:               x_out = x + Dropout(Sublayer(Norm(x)))

Norm is LayerNorm (each token over its d_model features), TokenBatchNorm (each feature over every
token of the batch), which PatchTST uses for time series, or NoNorm (the ablation without it).
NoResidual is the ablation without the skip: Norm(Dropout(Sublayer(x))), or Dropout(Sublayer(Norm(x))).
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from attnlab.nn.dropout import Dropout


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm over tokens: each of the d_model features standardised with its mean and variance
    over all B T tokens of the batch (running estimates in eval mode), then a learned gain and bias.
    Padding would count as tokens: for inputs without padding only (PatchTST's patches)."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__(d_model, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        return super().forward(x.flatten(0, -2)).view_as(x)


class NoNorm(nn.Identity):
    """No normalisation: the ablation of the norms."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()


class ResidualConnection(nn.Module):
    """A sublayer wrapped in dropout, a residual sum and a ``normalisation`` (LayerNorm by default),
    placed after ('post') or before ('pre')."""

    def __init__(self, d_model: int, dropout: float, placement: str, eps: float = 1e-5,
                 normalisation: type[nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.norm = normalisation(d_model, eps=eps)
        self.dropout = Dropout(dropout)
        self.pre_norm = {"pre": True, "post": False}[placement]

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class NoResidual(ResidualConnection):
    """The ablation without the residual sum: the sublayer's output replaces its input."""

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        if self.pre_norm:
            return self.dropout(sublayer(self.norm(x)))
        return self.norm(self.dropout(sublayer(x)))
