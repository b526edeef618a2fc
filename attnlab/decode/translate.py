"""Translate lines of text: tokenise, sort by length, decode in batches, restore the input order."""

from __future__ import annotations

import torch
from torch import nn
from tqdm import tqdm

from attnlab.data.batching import source_batch
from attnlab.data.tokenizers import Tokenizer
from attnlab.decode.spec import Search
from attnlab.errors import DataError

PROGRESS_DELAY = 1.0  # seconds before the bar appears: a quicker job shows none


@torch.no_grad()
def translate(
    model: nn.Module,
    tokenizers: dict[str, Tokenizer | None],
    lines: list[str],
    search: Search,
    max_source_len: int | None = None,
    truncate: bool = False,
    progress: bool = False,
    lengths: list[int] | None = None,
) -> list[list[tuple[str, float | None]]]:
    """For each line, its translations by ``search`` (decode/spec.py) as (text, score): for beam
    search its ``nbest``, scored log P / length penalty; greedy's and speculative decoding's are
    unscored (None), mask-predict's scored by their mean log-probability. Sentences of similar
    length are decoded together, ``search.batch_size`` at a time. A line of more than
    ``max_source_len`` tokens is refused (DataError naming it), or cut with ``truncate``. A blank
    line is not decoded: its translation is blank (scored ``search.blank_score``). With
    ``progress``, a bar on stderr counts the sentences done once decoding has taken longer than
    PROGRESS_DELAY seconds, and is cleared at the end (as the training bar is). ``lengths``: each
    line's output length in target tokens, exactly (Lake & Baroni's oracle-length decoding, greedy
    or beam search), in place of the search's ``max_len`` and ``min_len``."""
    if lengths is not None and len(lengths) != len(lines):
        raise ValueError(
            f"oracle lengths are for left-to-right search, one per line ({len(lengths)} for {len(lines)} lines)"
        )
    model.eval()
    device = next(model.parameters()).device
    src_tokenizer, tgt_tokenizer = tokenizers["src"], tokenizers["tgt"]
    if src_tokenizer is None or tgt_tokenizer is None:
        raise ValueError("translate reads a source tokenizer and writes with a target one: give both")
    src_ids = src_tokenizer.encode_batch(lines)
    if max_source_len is not None:
        for i, ids in enumerate(src_ids):
            if len(ids) > max_source_len and not truncate:
                raise DataError(
                    f"input line {i + 1}: {len(ids)} tokens, more than the model's {max_source_len}; "
                    f"shorten it, or pass --truncate to cut long lines"
                )
        src_ids = [ids[:max_source_len] for ids in src_ids]
    blank = [("", search.blank_score)]
    results: list[list[tuple[str, float | None]]] = [blank if not line.strip() else [] for line in lines]
    order = sorted((i for i, line in enumerate(lines) if line.strip()), key=lambda i: len(src_ids[i]))
    decode_text = tgt_tokenizer.decode
    with tqdm(
        total=len(order), disable=not progress, unit="sentence", delay=PROGRESS_DELAY, dynamic_ncols=True, leave=False
    ) as bar:
        for start in range(0, len(order), search.batch_size):
            chunk = order[start : start + search.batch_size]
            src = source_batch([src_ids[i] for i in chunk]).to(device)
            exact = None if lengths is None else torch.tensor([lengths[i] for i in chunk])
            for i, outputs in zip(chunk, search.decode(model, src, exact)):
                results[i] = [(decode_text(ids), score) for ids, score in outputs]
            bar.update(len(chunk))
    return results
