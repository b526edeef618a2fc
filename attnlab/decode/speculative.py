"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a cheap draft model proposes k
tokens one at a time, the target scores all of them in one pass, and keeps the longest prefix it
agrees with plus one token of its own. Each target pass yields between 1 and k + 1 tokens.

- Greedy: a proposal is kept while it is the target's argmax; the first that is not is replaced by
  the target's argmax. The output is plain greedy decoding's, token for token.
- Sampling: proposal x, drawn from the draft's q, is kept with probability min(1, p(x) / q(x)); the
  first rejected one is replaced by a draw from max(0, p - q), renormalised; when all k are kept,
  one more token is drawn from p. Each token is then distributed exactly as the target's p
  (temperature, top-k and top-p applied to both models alike), whatever the draft.

The draft is another model with the same vocabulary (a smaller run with the same tokenizer). One
sequence at a time: the two caches keep what was accepted and forget the rest (``truncate``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.data.tokenizers import EOS
from attnlab.decode.search import DecodingSession, filter_logits, length_limits


@dataclass
class SpeculationStats:
    """What speculation did: draft tokens proposed and accepted, target passes, tokens produced."""

    proposed: int = 0
    accepted: int = 0
    target_passes: int = 0
    tokens: int = 0
    accepted_runs: list[int] = field(default_factory=list)  # accepted proposals of each target pass

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.target_passes if self.target_passes else 0.0

    def add(self, other: "SpeculationStats") -> None:
        self.proposed += other.proposed
        self.accepted += other.accepted
        self.target_passes += other.target_passes
        self.tokens += other.tokens
        self.accepted_runs += other.accepted_runs


class Sampler:
    """How one token is chosen from log-probabilities: the argmax (``temperature`` None), or a draw
    from the filtered distribution with a seeded generator."""

    def __init__(self, temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None) -> None:
        if temperature is not None and temperature <= 0:
            raise ValueError(f"temperature must be > 0 (got {temperature})")
        self.temperature, self.top_k, self.top_p, self.generator = temperature, top_k, top_p, generator

    @property
    def greedy(self) -> bool:
        return self.temperature is None

    def probs(self, logprobs: Tensor) -> Tensor:
        """(..., V) -> (..., V) the distribution tokens are drawn from."""
        return filter_logits(logprobs, self.temperature, self.top_k, self.top_p).softmax(-1)

    def draw(self, probs: Tensor) -> int:
        return int(torch.multinomial(probs.cpu(), 1, generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))


@torch.no_grad()
def speculative_decode(target: nn.Module, draft: nn.Module, src: Tensor | None = None, prompt: Tensor | None = None,
                       k: int = 4, max_new_tokens: int | None = None, sampler: Sampler | None = None,
                       stop_at_eos: bool = True) -> tuple[list[int], SpeculationStats]:
    """The continuation of one (1, S) ``src`` (encoder-decoders) or (1, P) ``prompt`` (decoder-only
    models) and what speculation did. ``max_new_tokens``: for an encoder-decoder, default the
    source length + 50 (as greedy); both are capped by the positions the models can encode."""
    if k < 1:
        raise ValueError(f"k must be >= 1 (got {k})")
    rows = (src if src is not None else prompt).shape[0]
    if rows != 1:
        raise ValueError(f"speculative decoding takes one sequence at a time (got {rows})")
    sampler = sampler or Sampler()
    big = DecodingSession(target, src=src, prompt=prompt, kv_cache="dynamic")
    small = DecodingSession(draft, src=src, prompt=prompt, kv_cache="dynamic")
    limit = _new_token_limit(big, small, src, max_new_tokens)
    out: list[int] = []
    stats = SpeculationStats()
    big_pending, small_pending = big.start, small.start  # fed to neither model yet
    big_fed = small_fed = 0  # positions in each cache
    while len(out) < limit:
        proposals, q = _propose(small, small_pending, min(k, limit - len(out) - 1), sampler)
        fed = torch.cat([big_pending, big_pending.new_tensor([proposals])], dim=1) if proposals else big_pending
        p = big.score(fed)[0, big_pending.shape[1] - 1:]  # (len(proposals) + 1, V): after each proposal
        accepted, token = _verify(proposals, q, p, sampler)
        stats.proposed += len(proposals)
        stats.accepted += accepted
        stats.target_passes += 1
        stats.accepted_runs.append(accepted)
        # each cache keeps the pending tokens and the accepted proposals
        big_fed += big_pending.shape[1] + accepted
        big.truncate(big_fed)
        big_pending = big_pending.new_tensor([[token]])
        if not proposals:  # the draft was fed nothing
            small_pending = torch.cat([small_pending, big_pending], dim=1)
        elif accepted == len(proposals):  # the draft fed all but its last proposal
            small_fed += small_pending.shape[1] + accepted - 1
            small_pending = big_pending.new_tensor([[proposals[-1], token]])
        else:
            small_fed += small_pending.shape[1] + accepted
            small.truncate(small_fed)
            small_pending = big_pending
        out += [*proposals[:accepted], token]
        if stop_at_eos and EOS in out:
            out = out[:out.index(EOS)]
            break
    stats.tokens = len(out)
    return out[:limit], stats


def _new_token_limit(big: DecodingSession, small: DecodingSession, src: Tensor | None,
                     max_new_tokens: int | None) -> int:
    """The most tokens to produce: the request (or greedy's default), within both models' positions."""
    limit = int(length_limits(big, src, max_new_tokens, feeds_last=False)[0])
    return min(limit, int(length_limits(small, src, max_new_tokens, feeds_last=False)[0]))


def _propose(small: DecodingSession, pending: Tensor, n: int, sampler: Sampler) -> tuple[list[int], list[Tensor]]:
    """``n`` draft tokens after ``pending`` and the (V,) distribution each was drawn from; the
    last one is not fed to the draft (the target may replace it)."""
    tokens: list[int] = []
    dists: list[Tensor] = []
    fed = pending
    for i in range(n):
        logprobs = small.step(fed)[0]  # (V,)
        probs = sampler.probs(logprobs) if not sampler.greedy else logprobs
        token = int(probs.argmax()) if sampler.greedy else sampler.draw(probs)
        tokens.append(token)
        dists.append(probs)
        if i + 1 < n:
            fed = pending.new_tensor([[token]])
    return tokens, dists


def _verify(proposals: list[int], q: list[Tensor], p: Tensor, sampler: Sampler) -> tuple[int, int]:
    """How many proposals the target keeps, and its own next token. ``p`` (len + 1, V): the
    target's log-probabilities after the pending tokens and after each proposal."""
    if sampler.greedy:
        choices = p.argmax(-1).tolist()  # (len + 1,)
        for i, token in enumerate(proposals):
            if token != choices[i]:
                return i, choices[i]
        return len(proposals), choices[-1]
    target = sampler.probs(p)  # (len + 1, V)
    for i, token in enumerate(proposals):
        if sampler.uniform() * q[i][token] >= target[i, token]:  # rejected: u >= p(x) / q(x)
            residual = (target[i] - q[i]).clamp_min(0)
            return i, sampler.draw(residual / residual.sum())
    return len(proposals), sampler.draw(target[-1])
