"""``auto``, the default: PyTorch's fused kernel wherever it computes what ``math`` computes, and
``math`` where the weights themselves are needed."""

from __future__ import annotations

from attnlab.nn.backends.base import AttentionBackend
from attnlab.nn.backends.sdpa import SDPABackend


class AutoBackend(AttentionBackend):
    """Chooses per call. ``math`` when the weights are asked for (`inspect`, and Shaw's relative
    positions, whose value term is a sum over the probabilities) or when attention dropout runs on
    the CPU: PyTorch's fused CPU kernel has no dropout and falls back to a C++ copy of ``math``,
    while attnlab's own dropout keeps its draws, so a CPU run is the same under either backend.
    ``sdpa`` otherwise: inference everywhere, and training on a GPU, where the fused kernels drop
    probabilities themselves (with their own random draws). It declares all that ``math`` does,
    since it is ``math`` wherever ``sdpa`` cannot serve."""

    name = "auto"
    captures = True  # both choices capture, and the choice reads no tensor

    def __init__(self) -> None:
        self.fused, self.reference = SDPABackend(), AttentionBackend()

    def __call__(self, q, k, v, mask, q_pos, k_pos, dropout_p=0.0, bias=None, need_weights=False, cache=None):
        by_math = need_weights or (dropout_p > 0.0 and q.device.type == "cpu")
        chosen = self.reference if by_math else self.fused
        return chosen(q, k, v, mask, q_pos, k_pos, dropout_p, bias, need_weights, cache)
