"""One evaluation of a translation model on text: BLEU and chrF (sacrebleu, with signatures),
exact match, and the teacher-forced perplexity of the references."""

from __future__ import annotations

from typing import Any

from torch import nn

from attnlab.data.batching import collate_pairs
from attnlab.data.tokenizers import Tokenizer
from attnlab.decode.spec import Search
from attnlab.decode.translate import translate
from attnlab.eval.likelihood import evaluate as teacher_forced
from attnlab.eval.metrics import corpus_bleu, corpus_chrf, exact_match


def evaluate(
    model: nn.Module,
    tokenizers: dict[str, Tokenizer | None],
    sources: list[str],
    references: list[str],
    search: Search,
    progress: bool = False,
    oracle_length: bool = False,
) -> dict[str, Any]:
    """Decode ``sources`` by ``search`` (decode/spec.py) and score the output against ``references``
    (detokenised text); the record names the search's settings. With ``progress``, decoding shows
    :func:`~attnlab.decode.translate.translate`'s progress bar. A search whose model gives no
    left-to-right likelihood of a reference (mask-predict's) leaves the perplexity out. With
    ``oracle_length``, each output has its reference's length in tokens (Lake & Baroni 2018's
    oracle-length evaluation: EOS barred before it and forced at it)."""
    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} sources for {len(references)} references")
    src_tokenizer, tgt_tokenizer = tokenizers["src"], tokenizers["tgt"]
    if src_tokenizer is None or tgt_tokenizer is None:
        raise ValueError("evaluate scores a translation model, which has a source and a target tokenizer")
    tgt_ids = tgt_tokenizer.encode_batch(references)
    lengths = [len(ids) for ids in tgt_ids] if oracle_length else None
    hypotheses = [
        nbest[0][0] for nbest in translate(model, tokenizers, sources, search, progress=progress, lengths=lengths)
    ]
    bleu, bleu_signature = corpus_bleu(hypotheses, references)
    chrf, chrf_signature = corpus_chrf(hypotheses, references)
    scores = {
        "bleu": bleu,
        "bleu_signature": bleu_signature,
        "chrf": chrf,
        "chrf_signature": chrf_signature,
        "exact_match": exact_match(hypotheses, references),
        "sentences": len(sources),
    }
    if not search.scores_references:
        return scores | search.record() | {"hypotheses": hypotheses}
    src_ids = src_tokenizer.encode_batch(sources)
    pairs = list(zip(src_ids, tgt_ids))
    batches = [collate_pairs(pairs[i : i + search.batch_size]) for i in range(0, len(pairs), search.batch_size)]
    likelihood = teacher_forced(model, batches, next(model.parameters()).device)
    return scores | {
        "ppl": likelihood["ppl"],
        "nll": likelihood["loss"],
        **search.record(),
        "oracle_length": oracle_length,
        "hypotheses": hypotheses,
    }
