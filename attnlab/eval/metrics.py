"""Metrics over decoded text: BLEU and chrF through sacrebleu (with its signature, so that scores
can be compared across papers), exact match, perplexity."""

from __future__ import annotations

import math

from sacrebleu.metrics import BLEU, CHRF


def corpus_bleu(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
    """sacrebleu's corpus BLEU on detokenised text (13a tokenisation) and its signature."""
    metric = BLEU()
    return metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature())


def corpus_chrf(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
    """sacrebleu's chrF (character n-gram F-score, beta 2) and its signature."""
    metric = CHRF()
    return metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature())


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
