"""One evaluation of a translation model on text: BLEU and chrF (sacrebleu, with signatures),
exact match, and the teacher-forced perplexity of the references."""

from __future__ import annotations

from typing import Any

from torch import nn

from attnlab.data.batching import collate_pairs
from attnlab.data.tokenizers import Tokenizer
from attnlab.decode.translate import translate
from attnlab.eval.likelihood import evaluate as teacher_forced
from attnlab.eval.metrics import corpus_bleu, corpus_chrf, exact_match


def evaluate(model: nn.Module, tokenizers: dict[str, Tokenizer | None], sources: list[str], references: list[str],
             beam: int = 4, lenpen: float = 0.6, use_cache: bool = True, batch_size: int = 64,
             progress: bool = False, kv_cache: str = "auto") -> dict[str, Any]:
    """Decode ``sources`` and score the output against ``references`` (detokenised text); with
    ``progress``, decoding shows :func:`~attnlab.decode.translate.translate`'s progress bar."""
    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} sources for {len(references)} references")
    hypotheses = [nbest[0][0] for nbest in translate(model, tokenizers, sources, beam, lenpen, 1, use_cache, batch_size,
                                                     progress=progress, kv_cache=kv_cache)]
    bleu, bleu_signature = corpus_bleu(hypotheses, references)
    chrf, chrf_signature = corpus_chrf(hypotheses, references)
    src_ids = tokenizers["src"].encode_batch(sources)
    tgt_ids = tokenizers["tgt"].encode_batch(references)
    pairs = list(zip(src_ids, tgt_ids))
    batches = [collate_pairs(pairs[i:i + batch_size]) for i in range(0, len(pairs), batch_size)]
    scores = teacher_forced(model, batches, next(model.parameters()).device)
    return {"bleu": bleu, "bleu_signature": bleu_signature, "chrf": chrf, "chrf_signature": chrf_signature,
            "exact_match": exact_match(hypotheses, references), "ppl": scores["ppl"], "nll": scores["loss"],
            "sentences": len(sources), "beam": beam, "lenpen": lenpen, "hypotheses": hypotheses}
