"""Decoding speed: greedy with the KV cache against recomputing every prefix, as the number of new
tokens grows. Each step without a cache re-runs the decoder over the whole prefix, so its cost grows
with the length and the cache's advantage grows with it (the notes' claim, measured here)."""

from __future__ import annotations

import statistics
import time
from typing import Iterator

import torch

from attnlab.config import ModelConfig
from attnlab.decode.search import greedy
from attnlab.nn.build import build_model

# The benchmark shape: d_model 256, 3+3 layers, 4 heads, d_ff 1024, vocabulary 8000.
BENCH_MODEL = dict(vocab_size=8000, d_model=256, n_heads=4, n_layers=3, d_ff=1024, dropout=0.0, max_len=2048)


def bench_decode(new_tokens: tuple[int, ...] = (64, 256), batch: int = 8, src_len: int = 24,
                 repeats: int = 3, seed: int = 0) -> Iterator[dict]:
    """Yield one record per (length, cache on/off): generated tokens per second (median of
    ``repeats``), and for the cached runs the ratio cached / uncached."""
    torch.manual_seed(seed)
    model = build_model(ModelConfig(**BENCH_MODEL)).eval()
    src = torch.randint(4, BENCH_MODEL["vocab_size"], (batch, src_len))
    for n in new_tokens:
        rates = {}
        for use_cache in (False, True):
            greedy(model, src, max_len=2, min_len=2, use_cache=use_cache)  # warm-up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                out = greedy(model, src, max_len=n, min_len=n, use_cache=use_cache)  # exactly n tokens each
                times.append(time.perf_counter() - start)
            if any(len(row) != n for row in out):
                raise RuntimeError(f"decoding stopped before {n} tokens")  # min_len = max_len must hold
            seconds = statistics.median(times)
            rates[use_cache] = batch * n / seconds
            name = "decode_greedy" if use_cache else "decode_greedy_nocache"
            record = {"name": name, "new_tokens": n, "batch": batch, "value": round(rates[use_cache], 1),
                      "unit": "tokens/s", "seconds": round(seconds, 3)}
            if use_cache:
                record |= {"reference": "decode_greedy_nocache", "ratio": round(rates[True] / rates[False], 2)}
            yield record
