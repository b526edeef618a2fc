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
local       a sliding window ``|i - j| <= w``, blockwise                O(T w)
sparse      window + "fixed" strided summaries + global tokens +        O(T (w + T/s + g + r b))
            random key blocks (Sparse Transformer / Longformer /
            BigBird)
linear      phi(Q) (phi(K)^T V), phi = elu + 1 or positive random       O(T m d)
            features (Performer); causal by chunked prefix sums, and
            an O(1)-per-step recurrent state when decoding
==========  ==========================================================  =====================

The interface every backend implements is :class:`AttentionBackend` in nn/attention.py, beside the
exact kernels (``math``, ``sdpa``, ``auto``) of the default path and the multi-head attention that
calls them; this package holds the others, one module each. ``local`` and ``sparse`` give exactly
what ``math`` gives under the same pattern as an explicit mask (:meth:`SparsePattern.allowed`);
``linear`` is a different model of attention, exact only with respect to its own kernel formula.

Each backend declares what it supports (``AttentionBackend``'s class attributes: weights, explicit
masks, exactness, score bias, attention dropout, its own config fields, what cross-attention uses
instead, devices); it registers itself in ``BACKENDS`` by naming itself. Every module here is imported below, so a new backend is one new file here.
"""

import importlib
import pkgutil

# isort: off
# Imported in the order the docs list them, which is BACKENDS' order (and that of error messages).
from attnlab.nn.attention import BACKENDS, AttentionBackend, AutoBackend, BiasFn, SDPABackend
from attnlab.nn.backends.chunked import ChunkedBackend
from attnlab.nn.backends.sparse import LocalBackend, SparseBackend, SparsePattern
from attnlab.nn.backends.linear import FeatureMap, LinearBackend, LinearState
# isort: on

for _module in pkgutil.iter_modules(__path__):  # a backend not named above registers itself too
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["BACKENDS", "AttentionBackend", "AutoBackend", "BiasFn", "ChunkedBackend", "FeatureMap",
           "LinearBackend", "LinearState", "SDPABackend", "LocalBackend", "SparseBackend", "SparsePattern"]
