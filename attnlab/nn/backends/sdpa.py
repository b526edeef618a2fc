"""``sdpa``: PyTorch's fused scaled_dot_product_attention."""

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
