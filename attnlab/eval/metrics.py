"""Metrics: over decoded text, BLEU and chrF through sacrebleu (with its signature, so that scores
can be compared across papers), exact match, perplexity; over transcripts, the word and character
error rates through jiwer; over predicted classes, accuracy, macro-F1
and the confusion matrix."""

from __future__ import annotations

import math

import jiwer
from sacrebleu import BLEU, CHRF


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


def error_rates(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """jiwer's corpus word and character error rates (``wer``, ``cer``): the edits (substitutions,
    deletions, insertions) of every hypothesis against its reference, over the words (characters,
    spaces included) of all the references; an empty hypothesis is all deletions."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    return {"wer": jiwer.wer(references, hypotheses), "cer": jiwer.cer(references, hypotheses)}


def perplexity(nll_per_token: float) -> float:
    """exp of the mean negative log-likelihood per token (natural log), capped to stay finite."""
    return math.exp(min(nll_per_token, 700.0))


def confusion_matrix(predicted: list[int], gold: list[int], n_classes: int) -> list[list[int]]:
    """counts[g][p]: examples of class g predicted as p (rows the truth, as scikit-learn's)."""
    counts = [[0] * n_classes for _ in range(n_classes)]
    for p, g in zip(predicted, gold, strict=True):
        counts[g][p] += 1
    return counts


def confusion_table(labels: list[str], counts: list[list[int]]) -> list[str]:
    """The confusion matrix as text: a header row of predicted labels, then one row per true label;
    the columns of counts as wide as the widest label or count, every column two spaces apart."""
    first = max(len(label) for label in labels) + 2
    width = max(len(cell) for cell in [*labels, *(f"{count:,}" for row in counts for count in row)]) + 2
    return [
        " " * first + "".join(f"{label:>{width}}" for label in labels),
        *(f"{label:<{first}}" + "".join(f"{count:>{width},}" for count in row) for label, row in zip(labels, counts)),
    ]


def classification_scores(predicted: list[int], gold: list[int], n_classes: int) -> dict[str, float]:
    """Accuracy and macro-F1: the unweighted mean over classes of F1 = 2 TP / (2 TP + FP + FN), a
    class with no examples and no predictions counting 0 (scikit-learn's zero_division=0)."""
    counts = confusion_matrix(predicted, gold, n_classes)
    right = sum(counts[c][c] for c in range(n_classes))
    f1 = []
    for c in range(n_classes):
        missed = sum(counts[c]) - counts[c][c]  # FN: class c predicted as another
        wrong = sum(row[c] for row in counts) - counts[c][c]  # FP: another predicted as c
        denominator = 2 * counts[c][c] + missed + wrong
        f1.append(2 * counts[c][c] / denominator if denominator else 0.0)
    return {"accuracy": right / max(len(gold), 1), "macro_f1": sum(f1) / n_classes}
