"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a cheap draft model proposes k
tokens one at a time, the target scores all of them in one pass, and keeps the longest prefix it
agrees with plus one token of its own. Each target pass yields between 1 and k + 1 tokens.

- Greedy: a proposal is kept while it is the target's argmax; the first that is not is replaced by
  the target's argmax. The output is plain greedy decoding's, token for token.
- Sampling: proposal x, drawn from the draft's q, is kept with probability min(1, p(x) / q(x)); the
  first rejected one is replaced by a draw from max(0, p - q), renormalised; when all k are kept,
  one more token is drawn from p. Each token is then distributed exactly as the target's p
  (temperature, top-k and top-p applied to both models alike), whatever the draft.

The draft is another model with the same vocabulary (a smaller run with the same tokenizer,
:class:`ModelDraft`), or the target's own multi-token heads (:class:`HeadsDraft`), which propose
from the target's last pass at no cost of their own. One sequence at a time: the caches keep what
was accepted and forget the rest (``truncate``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, cast

import torch
from torch import Tensor, nn

from attnlab.data.tokenizers import EOS
from attnlab.decode.search import filter_logits
from attnlab.decode.session import DecodingSession, length_limits, token_logprobs

OWN_HEADS = "heads"  # what names the model's own multi-token heads as the draft (`--draft heads`)


class MultiTokenModel(Protocol):
    """A model whose multi-token heads draft (nn/decoder_lm.py's DecoderLM): ``ahead(states)``, (B, T, d_model)
    -> (B, T, 1 + k, V) logits: the next token's, then each head's."""

    def ahead(self, y: Tensor) -> Tensor: ...


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

    def __init__(
        self,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if temperature is not None and temperature <= 0:
            raise ValueError(f"temperature must be > 0 (got {temperature})")
        self.temperature, self.top_k, self.top_p, self.generator = temperature, top_k, top_p, generator

    @property
    def greedy(self) -> bool:
        return self.temperature is None

    def probs(self, logprobs: Tensor) -> Tensor:
        """(..., V) -> (..., V) the distribution tokens are drawn from."""
        assert self.temperature is not None  # asked only when sampling (not greedy)
        return filter_logits(logprobs, self.temperature, self.top_k, self.top_p).softmax(-1)

    def draw(self, probs: Tensor) -> int:
        return int(torch.multinomial(probs.cpu(), 1, generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))


class ModelDraft:
    """Another model (a smaller run with the same tokenizer) proposes, one token at a time; it is
    fed the tokens that are kept and forgets the rest."""

    def __init__(self, model: nn.Module, src: Tensor | None, prompt: Tensor | None) -> None:
        self.reads_heads = False  # it proposes from its own passes
        self.session = DecodingSession(model, src=src, prompt=prompt, kv_cache="dynamic")
        self.pending = self.session.start  # kept tokens it has not been fed yet
        self.fed = 0  # positions in its cache

    def propose(self, n: int, sampler: Sampler) -> tuple[list[int], list[Tensor]]:
        """``n`` tokens and the (V,) distribution each was drawn from; the last one is not fed to
        the draft (the target may replace it)."""
        tokens: list[int] = []
        dists: list[Tensor] = []
        fed = self.pending
        for i in range(n):
            token, dist = _choose(self.session.step(fed)[0], sampler)  # from (V,) log-probabilities
            tokens.append(token)
            dists.append(dist)
            if i + 1 < n:
                fed = fed.new_tensor([[token]])
        return tokens, dists

    def keep(self, proposals: list[int], accepted: int, token: int, states: Tensor | None) -> None:
        """The target kept ``accepted`` proposals and added ``token``."""
        after = self.pending.new_tensor([[token]])
        if not proposals:  # the draft was fed nothing
            self.pending = torch.cat([self.pending, after], dim=1)
        elif accepted == len(proposals):  # it was fed all but its last proposal
            self.fed += self.pending.shape[1] + accepted - 1
            self.pending = self.pending.new_tensor([[proposals[-1], token]])
        else:
            self.fed += self.pending.shape[1] + accepted
            self.session.truncate(self.fed)
            self.pending = after

    def cap(self, limit: int, src: Tensor | None, max_new_tokens: int | None) -> int:
        """The most new tokens, within the positions the draft can encode too."""
        return min(limit, int(length_limits(self.session, src, max_new_tokens, feeds_last=False)[0]))


class HeadsDraft:
    """The target's own multi-token heads propose (self-speculative decoding, Gloeckle et al. 2024):
    head j's distribution at the position whose next token the target just chose drafts the token
    j places after it. The heads run inside the target's pass: the draft costs no pass of its own."""

    def __init__(self, target: nn.Module) -> None:
        if not getattr(target, "heads", None):
            raise ValueError("the model has no multi-token heads to draft with (model.multi_token_heads is 0)")
        self.target = target
        self.reads_heads = True
        self.ahead: Tensor | None = None  # (k, V) the heads' log-probabilities; none before the first pass

    def propose(self, n: int, sampler: Sampler) -> tuple[list[int], list[Tensor]]:
        chosen = [] if self.ahead is None else [_choose(logprobs, sampler) for logprobs in self.ahead[:n]]
        return [token for token, _ in chosen], [dist for _, dist in chosen]

    def keep(self, proposals: list[int], accepted: int, token: int, states: Tensor | None) -> None:
        """The heads at the target's state where it chose ``token`` (the heads read only that one)."""
        assert states is not None  # the target's pass gives its states to a draft that reads_heads
        target = cast(MultiTokenModel, self.target)  # it has heads (checked when the draft was made)
        self.ahead = token_logprobs(target.ahead(states[accepted][None, None])[0, 0, 1:])  # (k, V)

    def cap(self, limit: int, src: Tensor | None, max_new_tokens: int | None) -> int:
        return limit  # the heads read the target's positions


@torch.no_grad()
def speculative_decode(
    target: nn.Module,
    draft: nn.Module | None = None,
    src: Tensor | None = None,
    prompt: Tensor | None = None,
    k: int = 4,
    max_new_tokens: int | None = None,
    sampler: Sampler | None = None,
    stop_at_eos: bool = True,
) -> tuple[list[int], SpeculationStats]:
    """The continuation of one (1, S) ``src`` (encoder-decoders) or (1, P) ``prompt`` (decoder-only
    models) and what speculation did. ``draft``: another model, or None for the target's own
    multi-token heads (at most k of them propose). ``max_new_tokens``: for an encoder-decoder,
    default the source length + 50 (as greedy); capped by the positions the models can encode."""
    if k < 1:
        raise ValueError(f"k must be >= 1 (got {k})")
    rows = (src if src is not None else cast(Tensor, prompt)).shape[0]  # a source, else a prompt
    if rows != 1:
        raise ValueError(f"speculative decoding takes one sequence at a time (got {rows})")
    sampler = sampler or Sampler()
    big = DecodingSession(target, src=src, prompt=prompt, kv_cache="dynamic")
    proposer = ModelDraft(draft, src, prompt) if draft is not None else HeadsDraft(target)
    limit = proposer.cap(int(length_limits(big, src, max_new_tokens, feeds_last=False)[0]), src, max_new_tokens)
    out: list[int] = []
    stats = SpeculationStats()
    pending, fed = big.start, 0  # kept tokens the target has not been fed; positions in its cache
    while len(out) < limit:
        proposals, q = proposer.propose(min(k, limit - len(out) - 1), sampler)
        p, states = _target_pass(big, pending, proposals, proposer.reads_heads)
        accepted, token = _verify(proposals, q, p, sampler)
        stats.proposed += len(proposals)
        stats.accepted += accepted
        stats.target_passes += 1
        stats.accepted_runs.append(accepted)
        fed += pending.shape[1] + accepted  # the target keeps the pending tokens and the accepted proposals
        big.truncate(fed)
        proposer.keep(proposals, accepted, token, states)
        pending = pending.new_tensor([[token]])
        out += [*proposals[:accepted], token]
        if stop_at_eos and EOS in out:
            out = out[: out.index(EOS)]
            break
    stats.tokens = len(out)
    return out[:limit], stats


def _target_pass(
    big: DecodingSession, pending: Tensor, proposals: list[int], states: bool
) -> tuple[Tensor, Tensor | None]:
    """Feed the pending tokens and the proposals to the target: (len + 1, V) log-probabilities
    after the last pending token and after each proposal, and with ``states`` the decoder's
    (len + 1, d_model) states at those positions, which multi-token heads read."""
    fed = torch.cat([pending, pending.new_tensor([proposals])], dim=1) if proposals else pending
    rows = slice(pending.shape[1] - 1, None)
    if not states:
        return big.score(fed)[0, rows], None
    p, h = big.score_states(fed)
    return p[0, rows], h[0, rows]


def _choose(logprobs: Tensor, sampler: Sampler) -> tuple[int, Tensor]:
    """A draft token from (V,) log-probabilities and the distribution it was drawn from (for
    greedy, the log-probabilities themselves: only their argmax matters)."""
    if sampler.greedy:
        return int(logprobs.argmax()), logprobs
    probs = sampler.probs(logprobs)
    return sampler.draw(probs), probs


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
