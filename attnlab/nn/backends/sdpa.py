"""``sdpa``: PyTorch's fused scaled_dot_product_attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.nn.backends.base import AttentionBackend


class SDPABackend(AttentionBackend):
    """``torch.nn.functional.scaled_dot_product_attention``: PyTorch picks a flash, memory-efficient
    or C++ kernel. Padding and bias travel as one float mask; causality without padding or bias as
    ``is_causal``, which lets the fused kernels skip the masked half."""

    name = "sdpa"
    returns_weights = False

    def compute(self, q, k, v, mask, q_pos, k_pos, dropout_p, bias):
        b = bias(q, q_pos, k_pos) if bias is not None else None
        square_causal = mask.causal and mask.key_valid is None and mask.explicit is None and q.shape[2] == k.shape[2]
        if b is None and square_causal:  # no (Tq, Tk) mask to build
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
