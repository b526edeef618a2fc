"""Position-wise feed-forward network: FFN(x) = W_2 act(W_1 x + b_1) + b_2, applied to every
position independently (the paper's act is ReLU; GELU and SiLU are options)."""

from __future__ import annotations

from torch import Tensor, nn


class PositionWiseFeedForward(nn.Module):
    """Two linear maps d_model -> d_ff -> d_model with the activation between them."""

    def __init__(self, d_model: int, d_ff: int, activation: nn.Module) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.activation = activation
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model). Dropout is applied by the residual connection around it."""
        return self.w_2(self.activation(self.w_1(x)))
