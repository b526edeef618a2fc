"""``sdpa``, PyTorch's fused scaled_dot_product_attention, and ``auto``, the default: that fused
kernel wherever it computes what ``math`` computes, and ``math`` where the weights themselves are
needed."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from attnlab.nn.backends.base import AttentionBackend
from attnlab.nn.masks import AttentionMask


class SDPABackend(AttentionBackend):
    """``torch.nn.functional.scaled_dot_product_attention``: PyTorch picks a flash, memory-efficient
    or C++ kernel. Padding and bias travel as one float mask; causality without padding or bias as
    ``is_causal``, which lets the fused kernels skip the masked half."""

    name = "sdpa"
    returns_weights = False
    captures = True

    @staticmethod
    def takes_no_mask_matrix(mask: AttentionMask, q: Tensor, k: Tensor) -> bool:
        """Whether the mask is all keys, or causality over as many queries as keys (``is_causal``):
        nothing (Tq, Tk) to build, and the flash kernel's O(T) memory."""
        return mask.key_valid is None and mask.explicit is None and (not mask.causal or q.shape[2] == k.shape[2])

    def compute(self, q, k, v, mask, q_pos, k_pos, dropout_p, bias):
        b = bias(q, q_pos, k_pos) if bias is not None else None
        if b is None and mask.causal and self.takes_no_mask_matrix(mask, q, k):  # no (Tq, Tk) mask to build
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True), None
        masks = mask.additive(q_pos, k_pos, q.dtype)  # built once for the layers of a stack
        if b is None and masks is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p), None
        attn_mask = b if masks is None else masks[0] if b is None else masks[0] + b
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        if masks is not None:  # a query with no allowed key: zeros, as in 'math' (not a uniform mix)
            out = out.masked_fill(masks[1], 0.0)
        return out, None


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
