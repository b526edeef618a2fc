"""Residual connection with layer normalisation, in either placement.

post (the paper):  x_out = LayerNorm(x + Dropout(Sublayer(x)))
pre:               x_out = x + Dropout(Sublayer(LayerNorm(x)))
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from attnlab.nn.dropout import Dropout


class ResidualConnection(nn.Module):
    """A sublayer wrapped in dropout, a residual sum and LayerNorm, placed after ('post') or before ('pre')."""

    def __init__(self, d_model: int, dropout: float, placement: str, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = Dropout(dropout)
        self.pre_norm = {"pre": True, "post": False}[placement]

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))
