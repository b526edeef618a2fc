"""How softmax(Q K^T / sqrt(d) + bias) V is computed: one config string, ``attention_backend``.

==========  ==========================================================  =====================
backend     computation                                                 cost in T (keys)
==========  ==========================================================  =====================
math        explicit scores, the reference; the only one with weights   O(T^2) time, memory
sdpa        torch's scaled_dot_product_attention (fused kernels)        O(T^2) time
auto        the default: sdpa, or math where weights are needed or      as the one it takes
            attention dropout runs on the CPU
chunked     exact, block by block with an online softmax; backward      O(T^2) time, O(T) memory
            recomputes each query block (never the T x T matrix); on
            a GPU, PyTorch's fused kernel where no mask or bias needs
            a (Tq, Tk) matrix
local       a sliding window |i - j| <= w, blockwise                    O(T w)
sparse      window + "fixed" strided summaries + global tokens +        O(T (w + T/s + g + r b))
            random key blocks (Sparse Transformer / Longformer / BigBird)
linear      phi(Q) (phi(K)^T V), phi = elu + 1 or positive random       O(T m d)
            features (Performer); causal by chunked prefix sums, and
            an O(1)-per-step recurrent state when decoding
==========  ==========================================================  =====================

Every backend takes queries (B, H, Tq, D), keys and values (B, H, Tk, D), an :class:`AttentionMask`
(padding and causality as structure, so that no backend has to build a (Tq, Tk) matrix), the
queries' and keys' positions (Tq,), (Tk,), the attention-dropout probability and an optional
``bias(q, q_pos, k_pos)`` of additive scores (relative / ALiBi positions). With a self-attention
cache, the backend decides what the cache keeps: all keys and values, or linear attention's state.
``local`` and ``sparse`` give exactly what ``math`` gives under the same pattern as an explicit
mask (:meth:`SparsePattern.allowed`); ``linear`` is a different model of attention, exact only
with respect to its own kernel formula.

Each backend is one module of this package (``auto``, which takes ``sdpa`` or ``math`` per call,
sits in sdpa.py with the kernel it prefers) and declares what it supports (``AttentionBackend``'s
class attributes: weights, explicit masks, exactness, score bias, attention dropout, its own config
fields, what cross-attention uses instead, devices); it registers itself in ``BACKENDS`` by naming
itself. Every module here is imported below, so a new backend is one new file.
"""

import importlib
import pkgutil

from attnlab.nn.backends.base import BACKENDS, AttentionBackend, BiasFn, attend, attention

# isort: off
# Imported in the order the docs list them, which is BACKENDS' order (and that of error messages).
from attnlab.nn.backends.sdpa import AutoBackend, SDPABackend
from attnlab.nn.backends.chunked import ChunkedBackend
from attnlab.nn.backends.sparse import LocalBackend, SparseBackend, SparsePattern
from attnlab.nn.backends.linear import FeatureMap, LinearBackend, LinearState
# isort: on

for _module in pkgutil.iter_modules(__path__):  # a backend not named above registers itself too
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["BACKENDS", "AttentionBackend", "AutoBackend", "BiasFn", "attend", "attention", "ChunkedBackend", "FeatureMap",
           "LinearBackend", "LinearState", "SDPABackend", "LocalBackend", "SparseBackend", "SparsePattern"]
