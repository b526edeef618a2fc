"""What every benchmark shares: timing in turn with medians (synchronised with the device), random
batches, and the check that a decoding run produced the fixed number of tokens it is timed for.

CUDA kernels run asynchronously: a call returns once its work is queued, so the clock read after it
would time the queueing, not the work. Every timing of the benches goes through :func:`timed`, which
waits for the device before starting the clock (so that earlier work is not charged to this call)
and before stopping it (so that this call's work is)."""

from __future__ import annotations

import functools
import statistics
import time
from typing import Callable, Mapping

import torch

from attnlab.data.batching import Batch, collate_pairs

CPU = torch.device("cpu")


def _no_sync() -> None:
    """The CPU's work is done when the call returns: nothing to wait for."""


def synchronizer(device: torch.device) -> Callable[[], None]:
    """What waits for ``device`` to finish the work queued on it: torch.cuda.synchronize(device) on
    CUDA, nothing on the CPU."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return _no_sync


def timed(fn: Callable[[], object], device: torch.device = CPU) -> tuple[float, object]:
    """(seconds, result) of one call of ``fn``, the device's queued work included."""
    sync = synchronizer(device)
    sync()
    start = time.perf_counter()
    result = fn()
    sync()
    return time.perf_counter() - start, result


def interleaved_medians(
    steps: Mapping[str, Callable[[], object]], repeats: int, warmup: int = 2, device: torch.device = CPU, calls: int = 1
) -> dict[str, float]:
    """Median seconds per call of each function, calling them in turn ``repeats`` times (after
    ``warmup`` untimed calls each), on ``device``. Each timed sample is ``calls`` calls in a row
    between two synchronisations, as a training loop runs its steps: on a GPU the host queues call
    n + 1 while the device runs call n, which a sample of one call (the device idle while the host
    queues its first kernels, the host idle while the device ends) does not see."""
    for fn in steps.values():
        for _ in range(warmup):
            fn()

    def in_a_row(fn: Callable[[], object]) -> None:
        for _ in range(calls):
            fn()

    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            times[name].append(timed(functools.partial(in_a_row, fn), device)[0] / calls)
    return {name: statistics.median(t) for name, t in times.items()}


def random_pairs(
    n_pairs: int, length: int, vocab: int, generator: torch.Generator, device: torch.device = CPU
) -> Batch:
    """``n_pairs`` pairs of ``length`` random ids (never a special token), collated as sources +
    EOS and BOS + targets, on ``device`` (drawn on the CPU, so that a seed gives the same ids
    everywhere)."""
    ids = torch.randint(4, vocab, (2, n_pairs, length), generator=generator).tolist()
    return collate_pairs(list(zip(ids[0], ids[1]))).to(device)


def checked_length(out: list[list[int]], n: int) -> None:
    """Every row has exactly ``n`` tokens (min_len = max_len must hold, or the timing is not comparable)."""
    if any(len(row) != n for row in out):
        raise RuntimeError(f"decoding stopped before {n} tokens")
