"""Translate lines of text: tokenise, sort by length, decode in batches, restore the input order."""

from __future__ import annotations

import torch
from torch import nn
from tqdm import tqdm

from attnlab.data.batching import source_batch
from attnlab.data.tokenizers import PAD, Tokenizer
from attnlab.decode.mask_predict import MaskPredict, mask_predict
from attnlab.decode.search import beam_search, greedy
from attnlab.decode.speculative import SpeculationStats, speculative_decode
from attnlab.errors import DataError

PROGRESS_DELAY = 1.0  # seconds before the bar appears: a quicker job shows none


@torch.no_grad()
def translate(model: nn.Module, tokenizers: dict[str, Tokenizer | None], lines: list[str], beam: int = 4,
              lenpen: float = 0.6, nbest: int = 1, use_cache: bool = True, batch_size: int = 64,
              max_len: int | None = None, min_len: int = 0, max_source_len: int | None = None,
              truncate: bool = False, progress: bool = False, kv_cache: str = "auto",
              draft: nn.Module | None = None, speculate: int = 4,
              speculation: SpeculationStats | None = None, parallel: MaskPredict | None = None,
              lengths: list[int] | None = None) -> list[list[tuple[str, float | None]]]:
    """For each line, its ``nbest`` translations as (text, score): log P / length penalty for beam
    search, None for greedy (``beam`` 1). Sentences of similar length are decoded together. A line
    of more than ``max_source_len`` tokens is refused (DataError naming it), or cut with ``truncate``.
    A blank line is not decoded: its translation is blank (score 0.0, or None for greedy).
    With ``progress``, a bar on stderr counts the sentences done once decoding has taken longer
    than PROGRESS_DELAY seconds, and is cleared at the end (as the training bar is). ``kv_cache``:
    the searches' cache (decode/session.py's KV_CACHES). With a ``draft`` model (greedy only), each
    sentence is decoded by speculative decoding, ``speculate`` proposals a pass: the same output,
    what speculation did added to ``speculation``. With ``parallel``, a conditional masked language
    model's translations by mask-predict (decode/mask_predict.py), scored by their mean log-probability;
    the options of left-to-right search do not apply. ``lengths``: each line's output length in
    target tokens, exactly (Lake & Baroni's oracle-length decoding, greedy or beam search), in place
    of ``max_len`` and ``min_len``."""
    if draft is not None and not (beam == 1 and nbest == 1 and min_len == 0 and lengths is None):
        raise ValueError("speculative decoding with a draft is greedy: beam 1, nbest 1, no min_len or lengths")
    if lengths is not None and (parallel is not None or len(lengths) != len(lines)):
        raise ValueError(f"oracle lengths are for left-to-right search, one per line ({len(lengths)} for "
                         f"{len(lines)} lines)")
    model.eval()
    device = next(model.parameters()).device
    src_ids = tokenizers["src"].encode_batch(lines)
    if max_source_len is not None:
        for i, ids in enumerate(src_ids):
            if len(ids) > max_source_len and not truncate:
                raise DataError(f"input line {i + 1}: {len(ids)} tokens, more than the model's {max_source_len}; "
                                f"shorten it, or pass --truncate to cut long lines")
        src_ids = [ids[:max_source_len] for ids in src_ids]
    greedy_search = beam == 1 and nbest == 1
    blank = [("", None if greedy_search else 0.0)]
    results: list[list[tuple[str, float | None]]] = [blank if not line.strip() else [] for line in lines]
    order = sorted((i for i, line in enumerate(lines) if line.strip()), key=lambda i: len(src_ids[i]))
    decode_text = tokenizers["tgt"].decode
    with tqdm(total=len(order), disable=not progress, unit="sentence", delay=PROGRESS_DELAY, dynamic_ncols=True,
              leave=False) as bar:
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            src = source_batch([src_ids[i] for i in chunk]).to(device)
            most, least = (max_len, min_len) if lengths is None else (torch.tensor([lengths[i] for i in chunk]),) * 2
            if draft is not None:
                for i, row in zip(chunk, src):
                    ids, stats = speculative_decode(model, draft, src=row[None, row != PAD], k=speculate,
                                                    max_new_tokens=max_len)
                    results[i] = [(decode_text(ids), None)]
                    if speculation is not None:
                        speculation.add(stats)
            elif parallel is not None:
                for i, (ids, score) in zip(chunk, mask_predict(model, src, parallel.iterations, parallel.length_beam)):
                    results[i] = [(decode_text(ids), score)]
            elif greedy_search:
                for i, ids in zip(chunk, greedy(model, src, most, least, use_cache, kv_cache)):
                    results[i] = [(decode_text(ids), None)]
            else:
                for i, hyps in zip(chunk, beam_search(model, src, beam, lenpen, nbest, most, least, use_cache,
                                                             kv_cache)):
                    results[i] = [(decode_text(h.tokens), h.normalized) for h in hyps]
            bar.update(len(chunk))
    return results
