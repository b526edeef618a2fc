"""Search over the models' incremental interface: encode once, then one step at a time.

A :class:`DecodingSession` hides the model kind (encoder-decoder or decoder-only) and whether the
KV cache is used: ``step(tokens)`` feeds the newest tokens of every row and returns the next-token
log-probabilities, ``reorder(index)`` follows beam search. With ``use_cache=False`` every step
recomputes the whole prefix: the same numbers, for checks and teaching. ``kv_cache`` picks the
cache (KV_CACHES): growable, static (preallocated for the decode's length limit), or static with
the one-token step replayed from a CUDA graph (decode/captured.py); the numbers are the same.

- :func:`greedy`: the argmax at every step;
- :func:`beam_search`: batch x beam rows in one tensor, GNMT length penalty, n-best lists;
- :func:`sample`: temperature, top-k and top-p (nucleus) sampling from a seeded generator.

``max_len`` is the most tokens generated before EOS (default: each sentence's own source length
+ 50, the paper's rule, within the positions the model can encode); a sentence decodes the same
alone or in any batch. The length in the length penalty counts EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.data.tokenizers import BOS, EOS, PAD
from attnlab.decode.captured import CapturedStep, CompiledStep
from attnlab.nn.attention import attention_modules

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

    def __init__(self, model: nn.Module, src: Tensor | None = None, prompt: Tensor | None = None,
                 use_cache: bool = True, kv_cache: str = "auto") -> None:
        """EncoderDecoder: ``src`` (N, S) ids, decoding starts from BOS. DecoderLM: ``prompt``
        (N, P) ids (not padded), decoding continues it. ``kv_cache``: one of KV_CACHES (unused
        without ``use_cache``)."""
        self.model = model
        self.seq2seq = hasattr(model, "encode")  # EncoderDecoder, or anything with its interface
        if self.seq2seq:
            self.memory, self.src_valid = model.encode(src)
            self.start = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
        else:
            self.memory = self.src_valid = None
            self.start = prompt
        self.kv_cache = cache_kind(kv_cache, model, self.start.device) if use_cache else None
        self.static = self.kv_cache in ("static", "graph", "compiled")
        self.cache = model.new_cache() if self.kv_cache == "dynamic" else None  # a static one: reserve()
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
        return token_logprobs(logits[:, -tokens.shape[1]:])

    def score_states(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`score` for a DecoderLM, with the (n, t, d_model) decoder states the log-probabilities
        come from: what its multi-token heads read."""
        h = self.model.states(self._fed(tokens), cache=self.cache)[:, -tokens.shape[1]:]
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
        return (f"kv_cache 'graph' records CUDA graphs, and this decode runs on '{device.type}'; "
                f"use 'static' or 'dynamic'")
    if kv_cache == "graph" and model.training:
        return ("a model in training mode drops out at random in every step; decode it in eval mode (model.eval()) "
                "to record its step as a CUDA graph")
    if not getattr(model, "static_cache", True):  # Transformer-XL: its window slides (nn/memory.py)
        return (f"{type(model).__name__}'s cache forgets the keys that leave its window, so it has no static cache; "
                f"use kv_cache 'dynamic'")
    backends = [module.backend for module in attention_modules(model).values()]
    if not backends:
        return f"{type(model).__name__} has no attention keys and values to preallocate; use kv_cache 'dynamic'"
    for backend in backends:
        if not backend.static_cache:
            return (f"attention backend '{backend.name}' keeps its own decoding state, not keys and values, "
                    f"so it has no static cache; use kv_cache 'dynamic'")
        if kv_cache == "graph" and not backend.captures:
            return (f"attention backend '{backend.name}' reads tensors on the host during a step, so the step "
                    f"cannot be recorded as a CUDA graph; use kv_cache 'static' or 'dynamic'")
    return None


def length_limits(session: DecodingSession, src: Tensor | None, max_len: int | None, feeds_last: bool) -> Tensor:
    """(N,) the most tokens each row may generate: ``max_len``, or its own source length + 50,
    within the positions the model can encode. ``feeds_last``: the last token is fed back in (beam
    search scores EOS after it), so it needs a position too. Each row's own limit keeps a sentence's
    output the same alone or in any batch."""
    n = session.start.shape[0]
    if max_len is not None:
        limits = torch.full((n,), max_len, dtype=torch.long)
    elif src is not None:
        limits = (src != PAD).sum(1).cpu() + 50
    else:
        limits = torch.full((n,), 50, dtype=torch.long)
    positions = session.max_positions
    if positions is not None:
        limits = limits.clamp(max=max(0, positions - session.start.shape[1] + (0 if feeds_last else 1)))
    return limits.to(session.start.device)


@torch.no_grad()
def greedy(model: nn.Module, src: Tensor | None = None, max_len: int | None = None, min_len: int = 0,
           use_cache: bool = True, kv_cache: str = "auto", prompt: Tensor | None = None) -> list[list[int]]:
    """The argmax token at every step until EOS. src: (B, S) padded ids (EncoderDecoder), or
    ``prompt``: (B, P) ids to continue (DecoderLM, not padded) -> B id lists (no BOS/EOS, no prompt)."""
    session = DecodingSession(model, src=src, prompt=prompt, use_cache=use_cache, kv_cache=kv_cache)
    limits = length_limits(session, src, max_len, feeds_last=False)  # (B,)
    session.reserve(int(limits.max()) - 1)  # the last token is not fed back
    min_lens = limits.clamp(max=min_len)
    B = session.start.shape[0]
    tokens, out = session.start, []
    finished = limits == 0
    for t in range(int(limits.max())):
        if finished.all():
            break
        logprobs = session.step(tokens)
        logprobs[t < min_lens, EOS] = -torch.inf
        next_token = logprobs.argmax(-1).masked_fill(finished, PAD)  # finished rows only pad (masked)
        out.append(next_token)
        finished |= (next_token == EOS) | (t + 1 >= limits)
        tokens = next_token[:, None]
    rows = torch.stack(out, dim=1).tolist() if out else [[] for _ in range(B)]
    return [_until_eos(row) for row in rows]


def _until_eos(row: list[int]) -> list[int]:
    """A row's tokens before its end: EOS, or the PAD fillers of a row stopped at its length limit
    (search never emits PAD itself)."""
    for i, token in enumerate(row):
        if token in (EOS, PAD):
            return row[:i]
    return row


@dataclass
class Hypothesis:
    """A finished beam: tokens without BOS/EOS, log P(tokens, EOS | source), and that score divided
    by the length penalty (what n-best lists are ranked by)."""

    tokens: list[int]
    score: float
    normalized: float


def length_penalty(length, alpha: float):
    """GNMT (Wu et al. 2016): lp(Y) = ((5 + |Y|) / 6)^alpha; alpha = 0 ranks by log-probability.
    ``length`` an int or a tensor of them."""
    return ((5.0 + length) / 6.0) ** alpha


def best_reachable(scores: Tensor, length: int, limits: Tensor, alpha: float) -> Tensor:
    """The best normalised score a live hypothesis can still finish with: (b,) log P so far, of
    hypotheses that can end at ``length`` tokens with EOS at the earliest and at ``limits`` + 1 at the
    latest -> (b,) an upper bound on log P(Y) / lp(Y). Adding tokens never raises log P (<= 0), so
    the bound is the score so far over the largest penalty in reach: at the length limit for
    alpha > 0, at the next step for alpha < 0, the score itself for alpha = 0."""
    largest = torch.maximum(length_penalty(limits + 1, alpha), length_penalty(torch.full_like(limits, length), alpha))
    return scores / largest


@torch.no_grad()
def beam_search(model: nn.Module, src: Tensor | None = None, beam: int = 4, lenpen: float = 0.6, nbest: int = 1,
                max_len: int | None = None, min_len: int = 0, use_cache: bool = True,
                kv_cache: str = "auto", prompt: Tensor | None = None) -> list[list[Hypothesis]]:
    """Beam search for a whole batch at once: B sentences x ``beam`` rows in one tensor: of ``src``
    (EncoderDecoder, (B, S) padded ids), or continuing ``prompt`` (DecoderLM, (B, P) ids, not padded;
    the scores are log P(tokens, EOS | prompt)).

    At each step the 2 x beam best continuations of each sentence are taken from its beam x V
    candidates (ranked by log-probability); those ending in EOS among the first ``beam`` are
    finished hypotheses, of which each sentence keeps the ``beam`` best by log P / lp(length), and
    the best ``beam`` others continue. After ``max_len`` tokens the live ones must end with EOS.

    Stopping: a sentence is done once no live hypothesis can still beat its worst kept one, i.e.
    once it has ``beam`` finished and the best normalised score a live one can reach
    (:func:`best_reachable`) is no higher than the worst of them. Stopping as soon as ``beam``
    have finished (fairseq's rule) is faster but can end the search before its best hypothesis
    does: on a confident model, short EOS candidates fill the slots while the likeliest output is
    still live. Returns for each sentence its ``nbest`` hypotheses, best first.
    """
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest ({nbest}) must be between 1 and beam ({beam})")
    given = src if src is not None else prompt  # (B, S) or (B, P)
    B, K = given.shape[0], beam
    repeated = {"src" if src is not None else "prompt": given.repeat_interleave(K, dim=0)}
    session = DecodingSession(model, **repeated, use_cache=use_cache, kv_cache=kv_cache)
    device = given.device
    limits = length_limits(session, repeated.get("src"), max_len, feeds_last=True)[::K]  # (B,)
    session.reserve(int(limits.max()))  # the last token is fed back, to score EOS after it
    min_lens = limits.clamp(max=min_len)
    worst_kept = torch.full((B,), -torch.inf, device=device)  # each sentence's K-th best finished; -inf below K
    scores = torch.full((B, K), -torch.inf, device=device)
    scores[:, 0] = 0.0  # all beams start as BOS: keep one, or the first step would fill the beam with copies
    tokens = torch.empty(B, K, 0, dtype=torch.long, device=device)  # (B, K, t) generated so far
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    active = torch.arange(B, device=device)  # sentence ids still in the batch
    step_input = session.start
    for t in range(int(limits.max()) + 1):
        b = len(active)
        logprobs = session.step(step_input).view(b, K, -1)  # (b, K, V)
        V = logprobs.shape[-1]
        logprobs[t < min_lens[active], :, EOS] = -torch.inf
        at_limit = t >= limits[active]  # these sentences have generated all they may: only EOS
        logprobs[at_limit, :, :EOS] = -torch.inf
        logprobs[at_limit, :, EOS + 1:] = -torch.inf
        candidates = (scores[..., None] + logprobs).view(b, K * V)  # (b, K V)
        top_scores, top_index = candidates.topk(2 * K, dim=1)  # (b, 2K), best first
        top_beam, top_token = top_index // V, top_index % V
        is_eos = top_token == EOS
        # finish the EOS candidates among the first K of each sentence; each keeps its K best
        for i, j in (is_eos[:, :K] & (top_scores[:, :K] > -torch.inf)).nonzero().tolist():
            sentence = int(active[i])
            score = float(top_scores[i, j])
            hyps = finished[sentence]
            hyps.append(Hypothesis(tokens[i, top_beam[i, j]].tolist(), score, score / length_penalty(t + 1, lenpen)))
            hyps.sort(key=lambda h: -h.normalized)
            del hyps[K:]
            if len(hyps) == K:
                worst_kept[sentence] = hyps[-1].normalized
        # the best K non-EOS candidates continue (at most K of the 2K end in EOS, one per beam)
        keep = ~is_eos & (torch.cumsum(~is_eos, dim=1) <= K)  # exactly K per sentence
        scores = top_scores[keep].view(-1, K)  # (b, K), best first
        beams, next_tokens = top_beam[keep].view(-1, K), top_token[keep].view(-1, K)
        rows = (torch.arange(b, device=device)[:, None] * K + beams).view(-1)  # (b K,) old rows
        tokens = torch.cat([tokens.reshape(b * K, t)[rows].reshape(b, K, t), next_tokens[..., None]], dim=2)
        session.reorder(rows, same_sources=True)
        done = at_limit | (best_reachable(scores[:, 0], t + 2, limits[active], lenpen) <= worst_kept[active])
        if done.all():
            break
        if done.any():  # drop finished sentences from the batch
            alive = (~done).nonzero().squeeze(1)
            active, scores, tokens, next_tokens = active[alive], scores[alive], tokens[alive], next_tokens[alive]
            session.reorder((alive[:, None] * K + torch.arange(K, device=device)).view(-1))
        step_input = next_tokens.view(-1, 1)
    return [hyps[:nbest] for hyps in finished]


def filter_logits(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None) -> Tensor:
    """(N, V) logits -> logits to sample from: divided by the temperature, then all but the
    ``top_k`` most likely and all outside the smallest set of probability >= ``top_p`` set to -inf."""
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -torch.inf)
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        outside = cumulative - sorted_logits.softmax(-1) >= top_p  # the mass before this token already reaches p
        logits = logits.masked_fill(outside.scatter(-1, order, outside), -torch.inf)
    return logits


@torch.no_grad()
def sample(model: nn.Module, src: Tensor | None = None, prompt: Tensor | None = None, max_new_tokens: int = 100,
           temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None, stop_at_eos: bool = True,
           use_cache: bool = True, kv_cache: str = "auto") -> list[list[int]]:
    """Draw a continuation for each row: of ``src`` (EncoderDecoder) or of ``prompt`` (DecoderLM).
    Returns the new token ids of each row (without the prompt, BOS or EOS).

    An encoder-decoder stops at the positions its decoder can encode. A decoder-only model with a
    position limit (learned positions, ``max_len``) goes on past it with a sliding context, as
    nanoGPT's sampler does: each further token is drawn given the last ``max_len`` tokens, which
    sit at positions 0 .. max_len - 1, so they are recomputed in one pass (no cache can carry over
    when every position shifts)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (got {temperature})")
    session = DecodingSession(model, src=src, prompt=prompt, use_cache=use_cache, kv_cache=kv_cache)
    window = session.max_positions if not session.seq2seq else None  # the context slides past this
    if window is None:
        max_new_tokens = int(length_limits(session, None, max_new_tokens, feeds_last=False).max())
        session.reserve(max_new_tokens - 1)  # the last token is not fed back
    else:  # this session serves until the context fills the window
        session.reserve(min(max_new_tokens - 1, window - prompt.shape[1]))
    tokens = session.start
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    out = []
    for _ in range(max_new_tokens):
        if window is not None and prompt.shape[1] + len(out) > window:  # no position left: slide
            context = torch.cat([prompt, *(t[:, None] for t in out[-window:])], dim=1)[:, -window:]  # the last tokens
            # one pass over the window; a cache would be filled and never read
            session = DecodingSession(model, prompt=context, use_cache=False)
            tokens = session.start
        logits = filter_logits(session.step(tokens), temperature, top_k, top_p)
        probs = logits.softmax(-1)
        next_token = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(1).to(tokens.device)
        next_token = next_token.masked_fill(finished, PAD)
        out.append(next_token)
        if stop_at_eos:
            finished |= next_token == EOS
            if finished.all():
                break
        tokens = next_token[:, None]
    rows = torch.stack(out, dim=1).tolist() if out else [[] for _ in range(tokens.shape[0])]
    return [_until_eos(row) if stop_at_eos else row for row in rows]
