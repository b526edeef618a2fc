"""``sdpa``: PyTorch's fused scaled_dot_product_attention."""

from __future__ import annotations

import torch
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
        allowed = mask.dense(q_pos, k_pos)
        if b is None and allowed is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p), None
        # half the most negative value: adding a bias cannot overflow to -inf, so no row becomes NaN
        attn_mask = b if allowed is None else torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(
            ~allowed, torch.finfo(q.dtype).min / 2) + (0.0 if b is None else b)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        if allowed is not None:  # a query with no allowed key: zeros, as in 'math' (not a uniform mix)
            out = out.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
        return out, None
