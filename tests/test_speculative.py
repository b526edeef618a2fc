"""Speculative decoding: greedy output equals plain greedy token for token (language models and
translation, several k, a perfect, a poor and an unrelated draft, every positional encoding that
decodes with a cache); with sampling, the tokens are distributed as the target's own sampling
(chi-square on many seeded draws, exact enumeration of a second token's marginal); the caches
forget rejected tokens."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from attnlab.data.tokenizers import BOS, EOS, PAD
from attnlab.decode.search import greedy
from attnlab.decode.session import DecodingSession
from attnlab.decode.speculative import Sampler, _verify, speculative_decode

from helpers import random_ids, tiny_model

V = 23


def plain_greedy_lm(model, prompt: torch.Tensor, n: int) -> list[int]:
    """The oracle: recompute the whole sequence, take the argmax, n times (or until EOS)."""
    ids = prompt
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(ids)[0, -1].float()
            logits[[PAD, BOS]] = -torch.inf
            token = int(logits.argmax())
            if token == EOS:
                break
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out


def drafts(arch: str, **target_fields):
    """A perfect draft (the target itself), a smaller unrelated one, and the target with its output
    layer scrambled."""
    target = tiny_model(arch=arch, **target_fields)
    small = tiny_model(arch=arch, d_model=8, n_heads=2, n_layers=1, d_ff=16)
    poor = tiny_model(arch=arch, **target_fields)
    with torch.no_grad():
        generator = poor.generator if hasattr(poor, "generator") else poor.lm_head
        for p in generator.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(5)))
    return target, {"itself": target, "smaller": small, "scrambled": poor}


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rotary", "alibi", "relative", "relative_bias"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculation_is_plain_greedy_for_a_language_model(positional, k):
    target, candidates = drafts("decoder_lm", positions=dict(scheme=positional))
    for seed in range(2):
        prompt = random_ids(1, 4, V, generator_seed=seed)
        expected = plain_greedy_lm(target, prompt, 30)
        for name, draft in candidates.items():
            got, stats = speculative_decode(target, draft, prompt=prompt, k=k, max_new_tokens=30)
            assert got == expected, (name, seed)
            assert stats.tokens == len(got) and stats.target_passes == len(stats.accepted_runs)
            produced = sum(stats.accepted_runs) + stats.target_passes  # accepted proposals + the target's own
            assert produced == len(got) if len(got) == 30 else produced > len(got)  # else cut at EOS
            if name == "itself":  # every proposal is kept: k + 1 tokens a pass
                assert stats.acceptance_rate == 1.0
                assert stats.target_passes == -(-len(got) // (k + 1)) or len(got) < 30


def test_a_poor_draft_is_mostly_rejected_and_changes_nothing():
    target, candidates = drafts("decoder_lm")
    prompt = random_ids(1, 4, V, generator_seed=1)
    good, good_stats = speculative_decode(
        target, candidates["itself"], prompt=prompt, k=4, max_new_tokens=40, stop_at_eos=False
    )
    poor, poor_stats = speculative_decode(
        target, candidates["smaller"], prompt=prompt, k=4, max_new_tokens=40, stop_at_eos=False
    )
    assert good == poor and len(good) == 40
    assert good_stats.acceptance_rate == 1.0 and good_stats.target_passes == 8  # 5 tokens a pass
    assert poor_stats.acceptance_rate < 0.3 and poor_stats.target_passes > 20


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_speculation_is_plain_greedy_for_translation(k):
    target, candidates = drafts("encoder_decoder")
    src = random_ids(1, 7, V, generator_seed=3)
    expected = greedy(target, src)[0]
    for name, draft in candidates.items():
        got, stats = speculative_decode(target, draft, src=src, k=k)
        assert got == expected, name
        assert stats.tokens == len(got) <= 7 + 50


def test_only_one_sequence_and_a_positive_k():
    target, candidates = drafts("decoder_lm")
    with pytest.raises(ValueError, match="one sequence at a time"):
        speculative_decode(target, target, prompt=random_ids(2, 3, V))
    with pytest.raises(ValueError, match="k must be >= 1"):
        speculative_decode(target, target, prompt=random_ids(1, 3, V), k=0)


def test_truncate_forgets_positions_as_if_never_fed():
    model = tiny_model(arch="decoder_lm", positions=dict(scheme="rotary"))
    ids = random_ids(1, 9, V)
    kept = DecodingSession(model, prompt=ids[:, :5], kv_cache="dynamic")
    kept.score(ids[:, :5])
    kept.score(ids[:, 5:9])  # four tokens later taken back
    kept.truncate(6)
    fresh = DecodingSession(model, prompt=ids[:, :6], kv_cache="dynamic")
    fresh.score(ids[:, :6])
    token = torch.tensor([[7]])
    torch.testing.assert_close(kept.score(token), fresh.score(token))


def first_tokens(target, draft, prompt, draws: int, **sampling) -> torch.Tensor:
    """(draws, 2) the first two tokens of ``draws`` speculative samplings, generator seeded 0."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(draws):
        out, _ = speculative_decode(
            target,
            draft,
            prompt=prompt,
            k=3,
            max_new_tokens=4,
            stop_at_eos=False,
            sampler=Sampler(generator=generator, **sampling),
        )
        rows.append(out[:2])
    return torch.tensor(rows)


def target_distribution(model, prompt, sampler: Sampler) -> torch.Tensor:
    with torch.no_grad():
        logprobs = model(prompt)[0, -1].float().log_softmax(-1)
    logprobs[[PAD, BOS]] = -torch.inf
    return sampler.probs(logprobs)


@pytest.mark.parametrize("k", [1, 3])
def test_the_verification_step_draws_from_the_target_distribution(k):
    """20,000 seeded verifications of k proposals drawn from q: the first token kept or drawn is
    distributed as p (chi-square), as is the token that follows k accepted proposals; q fails."""
    generator = torch.Generator().manual_seed(0)
    sampler = Sampler(temperature=1.0, generator=generator)
    p = torch.tensor([0.0, 0.0, 0.05, 0.4, 0.3, 0.15, 0.1, 0.0])  # (V,) target; PAD and BOS impossible
    q = torch.tensor([0.0, 0.0, 0.3, 0.1, 0.1, 0.2, 0.1, 0.2])  # the draft's: mass where p has none too
    logp = p.clamp_min(1e-30).log().masked_fill(p == 0, -torch.inf).expand(k + 1, -1)
    firsts = []
    for proposals in torch.multinomial(q, 20000 * k, replacement=True, generator=generator).view(20000, k).tolist():
        accepted, token = _verify(proposals, [q] * k, logp, sampler)
        firsts.append(proposals[0] if accepted else token)
    counts = torch.bincount(torch.tensor(firsts), minlength=8).float()
    assert counts[p == 0].sum() == 0
    assert chisquare(counts[p > 0], 20000 * p[p > 0]).pvalue > 1e-3
    assert chisquare(counts[p > 0], 20000 * q[p > 0] / q[p > 0].sum()).pvalue < 1e-6


def test_speculative_sampling_keeps_the_target_distribution():
    """1,000 seeded speculative samplings of two tokens with a tiny vocabulary, temperature 0.7 and
    top-k 6: the first against p by chi-square, the second against its exact marginal
    sum_x p(x) p(y | x), enumerated over the vocabulary; the draft's own distribution fails."""
    vocab, draws, sampling = 9, 1000, {"temperature": 0.7, "top_k": 6}
    target = tiny_model(arch="decoder_lm", vocab_size=vocab, d_model=16)
    with torch.no_grad():  # sharper, and far from the draft's
        target.generator.weight.mul_(4.0)
    draft = tiny_model(arch="decoder_lm", vocab_size=vocab, d_model=8, n_heads=2, n_layers=1, d_ff=16)
    prompt = torch.tensor([[5, 6, 7]])
    sampler = Sampler(**sampling)
    tokens = first_tokens(target, draft, prompt, draws, **sampling)
    p = target_distribution(target, prompt, sampler)
    q = target_distribution(draft, prompt, sampler)
    counts = torch.bincount(tokens[:, 0], minlength=vocab).float()
    assert counts[p == 0].sum() == 0  # nothing outside the target's (filtered) support
    assert chisquare(counts[p > 0], draws * p[p > 0]).pvalue > 1e-3
    assert chisquare(counts[p > 0], draws * (q[p > 0] / q[p > 0].sum()).clamp_min(1e-9)).pvalue < 1e-6
    second = sum(
        p[x] * target_distribution(target, torch.cat([prompt, torch.tensor([[x]])], dim=1), sampler)
        for x in range(vocab)
        if p[x] > 0
    )
    counts = torch.bincount(tokens[:, 1], minlength=vocab).float()
    assert chisquare(counts[second > 0], draws * second[second > 0]).pvalue > 1e-3
