"""Metrics over decoded text. (BLEU and chrF through sacrebleu arrive with the decoding issue.)"""

from __future__ import annotations

import math


def exact_match(hypotheses: list[str], references: list[str]) -> float:
    """Sequence accuracy: the fraction of hypotheses equal to their reference, after collapsing
    runs of whitespace."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    if not references:
        return 0.0
    same = sum(" ".join(h.split()) == " ".join(r.split()) for h, r in zip(hypotheses, references))
    return same / len(references)


def perplexity(nll_per_token: float) -> float:
    """exp of the mean negative log-likelihood per token (natural log), capped to stay finite."""
    return math.exp(min(nll_per_token, 700.0))
