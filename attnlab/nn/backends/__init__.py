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

The interface every backend implements is :class:`AttentionBackend` in nn/kernels.py, beside the
exact kernels (``math``, ``sdpa``, ``auto``) of the default path and the multi-head attention that
calls them; this package holds the others, one module each. ``local`` and ``sparse`` give exactly
what ``math`` gives under the same pattern as an explicit mask (:meth:`SparsePattern.allowed`);
``linear`` is a different model of attention, exact only with respect to its own kernel formula.

Each backend declares what it supports (``AttentionBackend``'s class attributes: weights, explicit
masks, exactness, score bias, attention dropout, its own options, what cross-attention uses
instead, devices); it registers itself in ``BACKENDS`` by naming itself. Every module here is imported below, so a new backend is one new file here.

A backend's options are a small frozen dataclass in its own module (``ChunkedOptions``,
``PatternOptions``, ``LinearOptions``); :class:`BackendOptions` composes them, and a Transformer
family's config holds one as ``backends`` (``model.backends.pattern.window``, ...). A backend with
options of its own adds its part here too.
"""

import importlib
import pkgutil
from dataclasses import dataclass

# isort: off
# Imported in the order the docs list them, which is BACKENDS' order (and that of error messages).
from attnlab.nn.kernels import BACKENDS, AttentionBackend, AutoBackend, BiasFn, SDPABackend
from attnlab.nn.backends.chunked import ChunkedBackend, ChunkedOptions
from attnlab.nn.backends.sparse import LocalBackend, PatternOptions, SparseBackend, SparsePattern
from attnlab.nn.backends.linear import FeatureMap, LinearBackend, LinearOptions, LinearState

# isort: on
from attnlab.nn.kernels import option_at_least


@dataclass(frozen=True)
class BackendOptions:
    """The backends' options, a Transformer family's ``model.backends``: ``block``, the queries a
    blockwise backend (chunked, local, sparse; linear's causal chunks) takes at a time, and each
    backend's own part. Only the chosen backend's part may differ from its defaults (the family's
    config checks it against each backend's ``fields``)."""

    block: int = 128
    chunked: ChunkedOptions = ChunkedOptions()
    pattern: PatternOptions = PatternOptions()
    linear: LinearOptions = LinearOptions()

    def __post_init__(self) -> None:
        option_at_least("block", self.block, 1)

    def option(self, path: str) -> object:
        """The option at ``path`` ('pattern.window')."""
        part, _, name = path.partition(".")
        return getattr(getattr(self, part), name)


for _module in pkgutil.iter_modules(__path__):  # a backend not named above registers itself too
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "BACKENDS",
    "AttentionBackend",
    "AutoBackend",
    "BackendOptions",
    "BiasFn",
    "ChunkedBackend",
    "ChunkedOptions",
    "FeatureMap",
    "LinearBackend",
    "LinearOptions",
    "LinearState",
    "PatternOptions",
    "SDPABackend",
    "LocalBackend",
    "SparseBackend",
    "SparsePattern",
]
