"""Search over the models' incremental interface, through a :class:`DecodingSession`
(decode/session.py: encode once, then one step at a time, with or without a KV cache of the kind
``kv_cache`` names):

- :func:`greedy`: the argmax at every step;
- :func:`beam_search`: batch x beam rows in one tensor, GNMT length penalty, n-best lists;
- :func:`filter_logits`: the temperature, top-k and top-p (nucleus) filter that sampling draws through
  (decode/spec.py's :func:`~attnlab.decode.spec.sample`).

``max_len`` is the most tokens generated before EOS (default: each sentence's own source length
+ 50, the paper's rule, within the positions the model can encode); a sentence decodes the same
alone or in any batch. The length in the length penalty counts EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor, nn

from attnlab.data.tokenizers import EOS, PAD
from attnlab.decode.session import DecodingSession, length_limits

Length = TypeVar("Length", float, Tensor)  # one length (an int), or a tensor of them


@torch.no_grad()
def greedy(
    model: nn.Module,
    src: Tensor | None = None,
    max_len: int | Tensor | None = None,
    min_len: int | Tensor = 0,
    use_cache: bool = True,
    kv_cache: str = "auto",
    prompt: Tensor | None = None,
) -> list[list[int]]:
    """The argmax token at every step until EOS. src: (B, S) padded ids (EncoderDecoder), or
    ``prompt``: (B, P) ids to continue (DecoderLM, not padded) -> B id lists (no BOS/EOS, no prompt).
    ``max_len`` and ``min_len``: one number, or (B,) one per row; both at a row's reference length
    give Lake & Baroni's oracle-length decoding (EOS barred before it, forced at it)."""
    session = DecodingSession(model, src=src, prompt=prompt, use_cache=use_cache, kv_cache=kv_cache)
    limits = length_limits(session, src, max_len, feeds_last=False)  # (B,)
    session.reserve(int(limits.max()) - 1)  # the last token is not fed back
    min_lens = limits.clamp(max=torch.as_tensor(min_len, device=limits.device))
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
    return [until_eos(row) for row in rows]


def until_eos(row: list[int]) -> list[int]:
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


def length_penalty(length: Length, alpha: float) -> Length:
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
def beam_search(
    model: nn.Module,
    src: Tensor | None = None,
    beam: int = 4,
    lenpen: float = 0.6,
    nbest: int = 1,
    max_len: int | Tensor | None = None,
    min_len: int | Tensor = 0,
    use_cache: bool = True,
    kv_cache: str = "auto",
    prompt: Tensor | None = None,
) -> list[list[Hypothesis]]:
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
    still live. Returns for each sentence its ``nbest`` hypotheses, best first. ``max_len`` and
    ``min_len``: one number, or (B,) one per sentence (both at its reference length: oracle length).
    """
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest ({nbest}) must be between 1 and beam ({beam})")
    given = src if src is not None else prompt  # (B, S) or (B, P)
    assert given is not None  # a source or a prompt
    B, K = given.shape[0], beam
    repeated = {"src" if src is not None else "prompt": given.repeat_interleave(K, dim=0)}
    session = DecodingSession(model, **repeated, use_cache=use_cache, kv_cache=kv_cache)
    device = given.device
    per_row = max_len.repeat_interleave(K) if isinstance(max_len, Tensor) else max_len  # (B K,) or one number
    limits = length_limits(session, repeated.get("src"), per_row, feeds_last=True)[::K]  # (B,)
    session.reserve(int(limits.max()))  # the last token is fed back, to score EOS after it
    min_lens = limits.clamp(max=torch.as_tensor(min_len, device=limits.device))
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
        logprobs[at_limit, :, EOS + 1 :] = -torch.inf
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


def filter_logits(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
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
