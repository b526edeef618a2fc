"""Translate lines of text: tokenise, sort by length, decode in batches, restore the input order."""

from __future__ import annotations

import torch
from torch import nn

from attnlab.data.batching import source_batch
from attnlab.data.tokenizers import Tokenizer
from attnlab.decode.search import beam_search, greedy


@torch.no_grad()
def translate(model: nn.Module, tokenizers: dict[str, Tokenizer | None], lines: list[str], beam: int = 4,
              lenpen: float = 0.6, nbest: int = 1, use_cache: bool = True, batch_size: int = 64,
              max_len: int | None = None, min_len: int = 0) -> list[list[tuple[str, float | None]]]:
    """For each line, its ``nbest`` translations as (text, score): log P / length penalty for beam
    search, None for greedy (``beam`` 1). Sentences of similar length are decoded together."""
    model.eval()
    device = next(model.parameters()).device
    src_ids = tokenizers["src"].encode_batch(lines)
    order = sorted(range(len(lines)), key=lambda i: len(src_ids[i]))
    results: list[list[tuple[str, float | None]]] = [[] for _ in lines]
    decode_text = tokenizers["tgt"].decode
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        src = source_batch([src_ids[i] for i in chunk]).to(device)
        if beam == 1 and nbest == 1:
            for i, ids in zip(chunk, greedy(model, src, max_len, min_len, use_cache)):
                results[i] = [(decode_text(ids), None)]
        else:
            for i, hyps in zip(chunk, beam_search(model, src, beam, lenpen, nbest, max_len, min_len, use_cache)):
                results[i] = [(decode_text(h.tokens), h.normalized) for h in hyps]
    return results
