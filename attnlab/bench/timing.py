"""What every benchmark shares: timing in turn with medians, random batches, and the check that a
decoding run produced the fixed number of tokens it is timed for."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from attnlab.data.batching import Batch, collate_pairs


def interleaved_medians(steps: dict[str, Callable[[], None]], repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each function, calling them in turn ``repeats`` times."""
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def random_pairs(n_pairs: int, length: int, vocab: int, generator: torch.Generator) -> Batch:
    """``n_pairs`` pairs of ``length`` random ids (never a special token), collated as sources +
    EOS and BOS + targets."""
    ids = torch.randint(4, vocab, (2, n_pairs, length), generator=generator).tolist()
    return collate_pairs(list(zip(ids[0], ids[1])))


def checked_length(out: list, n: int) -> None:
    """Every row has exactly ``n`` tokens (min_len = max_len must hold, or the timing is not comparable)."""
    if any(len(row) != n for row in out):
        raise RuntimeError(f"decoding stopped before {n} tokens")
