"""A pipeline stage (train.strategy pp): consecutive layers of one model's stack, the first stage
also what comes before the layers (the embeddings), the last also what comes after (the final
norm and a head). Between stages the values travel as a tuple of tensors, the *carried* ones:

    stage 0          carried = enter(inputs...)        (B, T) ids -> (B, T, d_model) states, ...
    every stage      carried = through(carried...)     its layers
    the last stage   outputs = leave(carried...)       -> logits

A family's stage is a small subclass that says what it carries and how its layers are called
(nn/decoder_lm.py, nn/encoder_only.py); its modules are the model's own, shared, so that training
a stage trains the model. A model that can be cut has ``stages(n, head)``: its n stages, the
layers shared as :func:`layer_ranges` says.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

Carried = tuple[Tensor, ...]


def layer_ranges(n_layers: int, stages: int) -> list[range]:
    """Each stage's layers: consecutive, the first ``n_layers % stages`` stages one more."""
    size, extra = divmod(n_layers, stages)
    starts = [s * size + min(s, extra) for s in range(stages + 1)]
    return [range(a, b) for a, b in zip(starts, starts[1:])]


class Stage(nn.Module):
    """Layers ``layers`` of ``n_layers``: the first stage enters the model, the last leaves it."""

    def __init__(self, layers: range, n_layers: int) -> None:
        super().__init__()
        self.first, self.last = layers.start == 0, layers.stop == n_layers

    def forward(self, *values: Tensor) -> Tensor | Carried:
        carried = self.enter(*values) if self.first else values
        carried = self.through(*carried)
        return self.leave(*carried) if self.last else carried

    # Any: each family's stage takes its own inputs and carries its own values (its signature says which)
    def enter(self, *inputs: Any) -> Carried:
        raise NotImplementedError

    def through(self, *carried: Any) -> Carried:
        raise NotImplementedError

    def leave(self, *carried: Any) -> Tensor:
        raise NotImplementedError
