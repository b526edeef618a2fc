"""The state of one decode, over the models' incremental interface: encode once, then one step at
a time (decode/search.py's greedy, beam search and sampling, and decode/speculative.py, drive it).

A :class:`DecodingSession` hides the model kind (encoder-decoder or decoder-only) and whether the
KV cache is used: ``step(tokens)`` feeds the newest tokens of every row and returns the next-token
log-probabilities, ``reorder(index)`` follows beam search. With ``use_cache=False`` every step
recomputes the whole prefix: the same numbers, for checks and teaching. ``kv_cache`` picks the
cache (KV_CACHES): growable, static (preallocated for the decode's length limit), or static with
the one-token step replayed from a CUDA graph (decode/captured.py); the numbers are the same
(:func:`cache_kind` resolves 'auto', :func:`static_refusal` says why a model cannot have a static
one).

``length_limits``: the most tokens each row may generate (default: each sentence's own source
length + 50, the paper's rule, within the positions the model can encode).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from attnlab.data.tokenizers import BOS, PAD
from attnlab.decode.captured import CapturedStep, CompiledStep
from attnlab.nn.attention import attention_modules
from attnlab.nn.interfaces import Seq2SeqModel

KV_CACHES = {
    "auto": "'graph' on a CUDA device where the model's attention allows it, else 'dynamic'",
    "dynamic": "a cache that grows as the decode goes",
    "static": "a cache preallocated for the decode's longest output: every step has the same shapes",
    "graph": "'static', with the one-token step recorded as a CUDA graph and replayed (CUDA only)",
    "compiled": "'static', with the one-token step compiled by torch.compile (the first decode pays for the compilation)",
}


class DecodingSession:
    """The state of decoding one batch: source memory and the cache, or the prefix so far.
    Works with any model that has the EncoderDecoder interface (encode, decode, new_cache) or the
    DecoderLM one (``model(ids, cache=...)``, new_cache).

    A static cache (``kv_cache`` 'static' or 'graph') is allocated by :meth:`reserve`, for the
    positions the search will feed, and keeps all N rows to the end, since its shapes are fixed:
    rows that leave the search (finished sentences of a beam search) stay in it, fed PAD, unread."""

    model: Any  # asked for its kind's methods (``seq2seq``): EncoderDecoder's, or DecoderLM's

    def __init__(
        self,
        model: nn.Module,
        src: Tensor | None = None,
        prompt: Tensor | None = None,
        use_cache: bool = True,
        kv_cache: str = "auto",
    ) -> None:
        """EncoderDecoder: ``src`` (N, S) ids, decoding starts from BOS. DecoderLM: ``prompt``
        (N, P) ids (not padded), decoding continues it. ``kv_cache``: one of KV_CACHES (unused
        without ``use_cache``)."""
        self.model = model
        self.seq2seq = isinstance(model, Seq2SeqModel)  # EncoderDecoder, or anything with its interface
        if self.seq2seq:
            assert src is not None  # an EncoderDecoder decodes a source
            self.memory, self.src_valid = self.model.encode(src)
            self.start = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
        else:
            assert prompt is not None  # a DecoderLM continues a prompt
            self.memory = self.src_valid = None
            self.start = prompt
        self.kv_cache = cache_kind(kv_cache, model, self.start.device) if use_cache else None
        self.static = self.kv_cache in ("static", "graph", "compiled")
        self.cache = self.model.new_cache() if self.kv_cache == "dynamic" else None  # a static one: reserve()
        self.next_logits = self._logits  # (N, t) tokens -> (N, 1, V); a CapturedStep of it with 'graph'
        self.prefix = self.start[:, :0]  # tokens fed so far, kept only without a cache

    @property
    def use_cache(self) -> bool:
        return self.kv_cache is not None

    def reserve(self, new_tokens: int) -> None:
        """Room for the start and ``new_tokens`` tokens fed after it: a static cache is allocated
        for exactly that many positions (a growable one needs no notice). Negative: a session that
        will not be stepped (a prompt longer than the positions; sampling slides at once)."""
        if self.static:
            self.cache = self.model.new_cache(capacity=max(0, self.start.shape[1] + new_tokens))
        if self.kv_cache == "graph":
            self.next_logits = CapturedStep(self._logits)
        if self.kv_cache == "compiled":
            self.next_logits = CompiledStep(self._logits)

    @property
    def max_positions(self) -> int | None:
        embed = getattr(self.model, "tgt_embed", None) or getattr(self.model, "embed", None)
        return None if embed is None else embed.positional.max_positions

    def step(self, tokens: Tensor) -> Tensor:
        """Feed (n, t) new tokens; return (n, V) log-probabilities of the token after them, with
        PAD and BOS ruled out (never an output)."""
        n = tokens.shape[0]
        if self.static:
            if self.cache is None:
                raise RuntimeError("a static cache is allocated by reserve(), before the first step")
            tokens = _with_rows(tokens, self.start.shape[0], PAD)  # rows that left: fed PAD
        if not self.use_cache:
            self.prefix = torch.cat([self.prefix, tokens], dim=1)
            tokens = self.prefix
        logits = self.next_logits(tokens)
        return token_logprobs(logits[:n, -1])  # only the last position was projected

    def score(self, tokens: Tensor) -> Tensor:
        """Feed (n, t) new tokens; return (n, t, V) log-probabilities of the token after each of them
        (PAD and BOS ruled out): what a target model checks a draft's t proposals with, in one pass."""
        fed = self._fed(tokens)
        if self.seq2seq:
            logits = self.model.decode(fed, self.memory, self.src_valid, self.cache)
        else:
            logits = self.model(fed, cache=self.cache)
        return token_logprobs(logits[:, -tokens.shape[1] :])

    def score_states(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`score` for a DecoderLM, with the (n, t, d_model) decoder states the log-probabilities
        come from: what its multi-token heads read."""
        h = self.model.states(self._fed(tokens), cache=self.cache)[:, -tokens.shape[1] :]
        return token_logprobs(self.model.generator(h)), h

    def _fed(self, tokens: Tensor) -> Tensor:
        """What a pass over (n, t) new tokens feeds the model: the tokens (with a cache), or the prefix
        with them."""
        if self.use_cache:
            return tokens
        self.prefix = torch.cat([self.prefix, tokens], dim=1)
        return self.prefix

    def truncate(self, length: int) -> None:
        """Forget the fed positions from ``length`` on (counting the start's), as if they had
        never been fed."""
        if self.cache is not None:
            self.cache.truncate(length)
        self.prefix = self.prefix[:, :length]

    def _logits(self, tokens: Tensor) -> Tensor:
        """(N, t) new tokens (with a cache; else the whole prefix) -> (N, 1, V) logits of the next."""
        if self.seq2seq:
            return self.model.decode(tokens, self.memory, self.src_valid, self.cache, last_only=True)
        return self.model(tokens, cache=self.cache, last_only=True)

    def reorder(self, index: Tensor, same_sources: bool = False) -> None:
        """Keep row ``index[i]`` as row i. ``same_sources``: every row keeps a row of the same source
        (beams of one sentence), so the source memory and its cached keys stay as they are."""
        if self.static:
            index = _with_rows(index, self.start.shape[0], 0)  # rows that left: any row, never read
        if self.cache is not None:
            self.cache.reorder(index, targets_only=same_sources)
        self.prefix = self.prefix.index_select(0, index)
        if self.memory is not None and not same_sources:
            self.memory = self.memory.index_select(0, index)
            self.src_valid = self.src_valid.index_select(0, index)


def token_logprobs(logits: Tensor) -> Tensor:
    """(..., V) logits -> float32 log-probabilities of the next token, PAD and BOS ruled out (never
    an output)."""
    logprobs = logits.float().log_softmax(dim=-1)
    logprobs[..., [PAD, BOS]] = -torch.inf
    return logprobs


def _with_rows(x: Tensor, rows: int, fill: int) -> Tensor:
    """(n, ...) -> (rows, ...): x, then rows of ``fill``."""
    return torch.cat([x, x.new_full((rows - x.shape[0], *x.shape[1:]), fill)])


def cache_kind(kv_cache: str, model: nn.Module, device: torch.device) -> str:
    """The KV_CACHES entry to decode ``model`` with on ``device``, 'auto' resolved; refuses a
    static cache (or a graph) that the model cannot use, saying why."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHES)} (got {kv_cache!r})")
    if kv_cache == "auto":
        return "dynamic" if static_refusal(model, "graph", device) else "graph"
    refusal = static_refusal(model, kv_cache, device) if kv_cache != "dynamic" else None
    if refusal:
        raise ValueError(refusal)
    return kv_cache


def static_refusal(model: nn.Module, kv_cache: str, device: torch.device) -> str | None:
    """Why ``model`` cannot decode on ``device`` with a 'static' cache (or 'graph': one whose step
    is recorded as a CUDA graph; or 'compiled'); None when it can. The attention backends declare
    what they can, and a model whose cache slides (``static_cache = False``) that it has none."""
    if kv_cache == "graph" and device.type != "cuda":
        return (
            f"kv_cache 'graph' records CUDA graphs, and this decode runs on '{device.type}'; use 'static' or 'dynamic'"
        )
    if kv_cache == "graph" and model.training:
        return (
            "a model in training mode drops out at random in every step; decode it in eval mode (model.eval()) "
            "to record its step as a CUDA graph"
        )
    if not getattr(model, "static_cache", True):  # Transformer-XL: its window slides (nn/memory.py)
        return (
            f"{type(model).__name__}'s cache forgets the keys that leave its window, so it has no static cache; "
            f"use kv_cache 'dynamic'"
        )
    backends = [module.backend for module in attention_modules(model).values()]
    if not backends:
        return f"{type(model).__name__} has no attention keys and values to preallocate; use kv_cache 'dynamic'"
    for backend in backends:
        if not backend.static_cache:
            return (
                f"attention backend '{backend.name}' keeps its own decoding state, not keys and values, "
                f"so it has no static cache; use kv_cache 'dynamic'"
            )
        if kv_cache == "graph" and not backend.captures:
            return (
                f"attention backend '{backend.name}' reads tensors on the host during a step, so the step "
                f"cannot be recorded as a CUDA graph; use kv_cache 'static' or 'dynamic'"
            )
    return None


def length_limits(
    session: DecodingSession, src: Tensor | None, max_len: int | Tensor | None, feeds_last: bool
) -> Tensor:
    """(N,) the most tokens each row may generate: ``max_len`` (one number, or (N,) one per row), or
    its own source length + 50, within the positions the model can encode. ``feeds_last``: the last token is fed back in (beam
    search scores EOS after it), so it needs a position too. Each row's own limit keeps a sentence's
    output the same alone or in any batch."""
    n = session.start.shape[0]
    if isinstance(max_len, Tensor):
        limits = max_len.to("cpu", torch.long)
    elif max_len is not None:
        limits = torch.full((n,), max_len, dtype=torch.long)
    elif src is not None:
        limits = (src != PAD).sum(1).cpu() + 50
    else:
        limits = torch.full((n,), 50, dtype=torch.long)
    positions = session.max_positions
    if positions is not None:
        limits = limits.clamp(max=max(0, positions - session.start.shape[1] + (0 if feeds_last else 1)))
    return limits.to(session.start.device)
