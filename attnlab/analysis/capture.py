"""Recording attention probabilities without changing the model's numbers.

    with capture_attention(model) as captured:
        logits = model(src, tgt_in)
    captured.records  # one AttentionRecord per attention call: which module, (B, H, Tq, Tk) weights

Every MultiHeadAttention computes with a :class:`WeightsRecorder` for the duration: 'math', which
forms the weights, handing them over at each call. A model built with another exact backend
('sdpa', 'auto', 'chunked') gives the same numbers to rounding; 'local', 'sparse' and 'linear' are
refused. A recurrent decoder's alignment (``last_attention``) is kept by a forward hook, as one head.

During decoding the hooks record every step, (B, H, 1, Tk) per call. For the hypothesis a search
chose, :func:`attention_of` runs one teacher-forced pass over it instead: cached and uncached
decoding give the same numbers (tests/test_transformer.py), so these are the probabilities the
decoder had when it produced each token, and a beam's reorders need no bookkeeping.
"""

from __future__ import annotations

import contextlib
import functools
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import Tensor, nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.backends import AttentionBackend
from attnlab.nn.cache import KVCache
from attnlab.nn.kernels import BiasFn
from attnlab.nn.masks import AttentionMask
from attnlab.nn.registry import ATTENTION_BACKENDS
from attnlab.nn.rnn import LakeBaroniDecoder, RNNDecoder

_NAME = re.compile(r"(?P<stack>\w+)\.layers\.(?P<layer>\d+)\.(?P<kind>self|cross)_attn$")


@dataclass
class AttentionRecord:
    """One attention call: module path, stack ('encoder' / 'decoder'), layer, kind ('self' /
    'cross') and the weights (B, H, Tq, Tk) as applied to the values (eval mode: the softmax)."""

    module: str
    stack: str
    layer: int
    kind: str
    probs: Tensor


@dataclass
class AttentionCapture:
    records: list[AttentionRecord] = field(default_factory=list)

    def last(self) -> dict[str, AttentionRecord]:
        """The latest record of each module, in call order (one teacher-forced pass: all of them)."""
        latest: dict[str, AttentionRecord] = {}
        for record in self.records:
            latest.pop(record.module, None)
            latest[record.module] = record
        return latest


def _describe(name: str) -> tuple[str, int, str]:
    match = _NAME.search(name)
    if match is None:
        return name, 0, "self"
    return match["stack"], int(match["layer"]), match["kind"]


class WeightsRecorder(AttentionBackend):
    """'math' that hands the weights (B, H, Tq, Tk) of each call to ``keep``."""

    def __init__(self, keep: Callable[[Tensor], None]) -> None:
        self.keep = keep

    def compute(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttentionMask,
        q_pos: Tensor,
        k_pos: Tensor,
        dropout_p: float,
        bias: BiasFn | None,
        cache: KVCache | None,
    ) -> tuple[Tensor, Tensor | None]:
        out, probs = super().compute(q, k, v, mask, q_pos, k_pos, dropout_p, bias, cache)
        assert probs is not None, "'math' forms the weights"
        self.keep(probs)
        return out, probs


@contextlib.contextmanager
def capture_attention(model: nn.Module) -> Iterator[AttentionCapture]:
    """Record every attention call of ``model`` inside the ``with`` block."""
    capture = AttentionCapture()
    handles, swapped = [], []

    def keep(name: str, probs: Tensor) -> None:
        stack, layer, kind = _describe(name)
        capture.records.append(AttentionRecord(name, stack, layer, kind, probs.detach()))

    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            if not module.backend.exact:
                exact = ", ".join(repr(n) for n, backend in ATTENTION_BACKENDS.items() if backend.exact)
                raise ValueError(
                    f"{name}: attention backend '{module.backend.name}' does not form softmax weights "
                    f"over all keys; capture needs an exact backend ({exact})"
                )
            swapped.append((module, module.backend))
            module.backend = WeightsRecorder(functools.partial(keep, name))
        elif isinstance(module, (RNNDecoder, LakeBaroniDecoder)) and module.score is not None:
            # the decoder's alignment (B, T, S), as one head: stack 'decoder', layer 0, kind 'cross'
            handles.append(
                module.register_forward_hook(
                    lambda m, a, out, name=name: keep(f"{name}.layers.0.cross_attn", m.last_attention[:, None])
                )
            )
    try:
        yield capture
    finally:
        for handle in handles:
            handle.remove()
        for module, backend in swapped:
            module.backend = backend


@torch.no_grad()
def attention_of(model: nn.Module, src: Tensor | None, tgt_in: Tensor) -> dict[str, AttentionRecord]:
    """Every module's weights for one teacher-forced pass over ``tgt_in`` (B, T) (BOS + the tokens
    a search chose), with ``src`` (B, S) for an encoder-decoder."""
    model.eval()
    with capture_attention(model) as captured:
        model(src, tgt_in) if src is not None else model(tgt_in)
    return captured.last()
