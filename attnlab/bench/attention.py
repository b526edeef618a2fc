"""Time and memory of each attention backend as the sequence grows (the notes' O(T^2) wall).

For each backend and length T: queries, keys and values (B, H, T, D) in float32 with a causal mask,
timed for the forward alone and for forward + backward (gradients of all three), median of a few
repetitions, on one device. Memory is the peak above what was held just before the pass (inputs
allocated), counting what the pass allocates, its outputs and gradients included. On the CPU that
is the process's peak resident set: Linux's VmHWM, reset through /proc/self/clear_refs, whatever
the allocator (it needs Linux). On CUDA it is the caching allocator's peak of allocated bytes
(torch.cuda.max_memory_allocated, reset before each pass): the RSS does not see GPU memory, and the
allocator's reserved pool would count blocks kept from earlier passes. Each record says which.

A size whose predicted memory (the (B, H, T, T) scores times what the backend kept per score at the
largest size it ran) exceeds the budget, or whose predicted time (from the previous size, scaled by
the backend's complexity) exceeds the time limit, is reported as skipped with the reason.
"""

from __future__ import annotations

import ctypes
import gc
import re
import statistics
from pathlib import Path
from typing import Any, Callable, Iterator, cast

import torch

from attnlab.bench.device import device_fields
from attnlab.bench.timing import CPU, timed
from attnlab.nn.backends import (
    AttentionBackend,
    ChunkedBackend,
    FeatureMap,
    LinearBackend,
    LocalBackend,
    SDPABackend,
    SparseBackend,
    SparsePattern,
)
from attnlab.nn.masks import AttentionMask

LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
GiB = 2**30


def backends(head_dim: int, window: int = 256, block: int = 128) -> dict[str, AttentionBackend]:
    """The backends as the bench runs them: a window of +-256 keys, sparse with 128-position
    strides, 16 global tokens and 2 random blocks, linear with elu + 1 features."""
    return {
        "math": AttentionBackend(),
        "sdpa": SDPABackend(),
        "chunked": ChunkedBackend(q_block=block, k_block=1024),
        "local": LocalBackend(window, block),
        "sparse": SparseBackend(SparsePattern(window=window // 2, stride=128, n_global=16, n_random=2, block=block)),
        "linear": LinearBackend(FeatureMap("elu", head_dim), chunk=block),
    }


# How each backend's time grows with T, to predict the next size from the last one.
GROWTH = {"math": 2, "sdpa": 2, "chunked": 2, "local": 1, "sparse": 1.5, "linear": 1}


def _status_bytes(field: str) -> int:
    # Linux's status file always has the field (VmRSS, VmHWM)
    found = cast(re.Match[str], re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()))
    return int(found.group(1)) * 1024


def _trim() -> None:
    """Give freed memory back to the system so that the next baseline is honest."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


PEAK_MEMORY = {"cpu": "process resident set (VmHWM)", "cuda": "CUDA allocator (max_memory_allocated)"}


def _reset_peak(device: torch.device) -> int:
    """Start the peak counter of ``device`` from now; the bytes held now (the baseline)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # frees of earlier passes land before the reset
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    _trim()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current VmRSS
    return _status_bytes("VmRSS")


def _peak(device: torch.device) -> int:
    """The most bytes held on ``device`` since :func:`_reset_peak`."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return _status_bytes("VmHWM")


def measure_peak(fn: Callable[[], object], device: torch.device = CPU) -> tuple[float, int]:
    """Run ``fn`` once on ``device``: (seconds, peak bytes above what was held just before)."""
    baseline = _reset_peak(device)
    seconds, result = timed(fn, device)
    peak = _peak(device) - baseline
    del result
    return seconds, max(peak, 0)


def _pass(
    backend: AttentionBackend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    pos: torch.Tensor,
    backward: bool,
) -> Callable[[], object]:
    """One timed call. Each call makes its own AttentionMask, as a model's forward does, so that a
    backend that builds the dense mask pays for it every time (the mask keeps what it built)."""

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return backend(q, k, v, AttentionMask(causal=causal), pos, pos)[0]

    def forward_backward() -> tuple[torch.Tensor, ...]:
        out = backend(q, k, v, AttentionMask(causal=causal), pos, pos)[0]
        return torch.autograd.grad(out.sum(), (q, k, v))

    return forward_backward if backward else forward


def bench_attention(
    lengths: tuple[int, ...] = LENGTHS,
    names: tuple[str, ...] | None = None,
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 64,
    causal: bool = True,
    repeats: int = 3,
    memory_budget: float = 12 * GiB,
    time_limit: float = 60.0,
    seed: int = 0,
    device: torch.device = CPU,
) -> Iterator[dict[str, Any]]:
    """Yield one record per (backend, T, pass) on ``device``: seconds, peak_bytes, or skipped with a reason."""
    available = backends(head_dim)
    names = tuple(available) if names is None else names
    kept_per_score: dict[tuple[str, str], float] = {}  # peak / scores bytes at the last size that ran
    last_seconds: dict[tuple[str, str], tuple[int, float]] = {}
    for T in lengths:
        g = torch.Generator().manual_seed(seed)
        q, k, v = (
            torch.randn(batch, heads, T, head_dim, generator=g).to(device).requires_grad_() for _ in range(3)
        )  # (B, H, T, D) each, drawn on the CPU: the same numbers on every device
        pos = torch.arange(T, device=device)
        scores_bytes = batch * heads * T * T * 4
        for name in names:
            for pass_name in ("forward", "forward_backward"):
                key = (name, pass_name)
                record = {
                    "backend": name,
                    "seq_len": T,
                    "pass": pass_name,
                    "batch": batch,
                    "heads": heads,
                    "head_dim": head_dim,
                    "dtype": "float32",
                    "causal": causal,
                    "scores_bytes": scores_bytes,
                    "peak_memory": PEAK_MEMORY[device.type],
                    **device_fields(device),
                }
                reason = _skip_reason(key, T, scores_bytes, kept_per_score, last_seconds, memory_budget, time_limit)
                if reason:
                    yield record | {"skipped": reason}
                    continue
                fn = _pass(available[name], q, k, v, causal, pos, pass_name == "forward_backward")
                seconds, peak = measure_peak(fn, device)  # the first run: memory, and a warm-up
                if seconds < time_limit / 4:  # then time it again, warm
                    seconds = statistics.median(measure_peak(fn, device)[0] for _ in range(repeats))
                if name == "math":
                    kept_per_score[key] = peak / scores_bytes
                last_seconds[key] = (T, seconds)
                yield record | {"seconds": round(seconds, 5), "peak_bytes": peak}
        del q, k, v


def _skip_reason(
    key: tuple[str, str],
    T: int,
    scores_bytes: int,
    kept_per_score: dict[tuple[str, str], float],
    last_seconds: dict[tuple[str, str], tuple[int, float]],
    memory_budget: float,
    time_limit: float,
) -> str | None:
    name, _ = key
    if name == "math":
        # the forward alone holds the scores and the probabilities: twice the scores at the very least
        per_score = max(kept_per_score.get(key, 0.0), 2.0)
        if per_score * scores_bytes > memory_budget:
            return (
                f"the (B, H, T, T) scores alone need {scores_bytes / GiB:.2f} GiB, and math keeps about "
                f"{per_score:.1f} times that (measured at a smaller T): {per_score * scores_bytes / GiB:.1f} "
                f"GiB > the {memory_budget / GiB:.0f} GiB budget"
            )
    if key in last_seconds:
        T0, s0 = last_seconds[key]
        predicted = s0 * (T / T0) ** GROWTH[name]
        if predicted > time_limit:
            return f"would take about {predicted:.0f} s (from {s0:.1f} s at T={T0}), over the {time_limit:.0f} s limit"
    return None


def plot_attention(records: list[dict[str, Any]], path: str | Path) -> None:
    """Time and peak memory against T, log-log, one line per backend (forward + backward solid,
    forward dashed), written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(12, 4.8))
    names = list(dict.fromkeys(r["backend"] for r in records))
    for i, name in enumerate(names):
        for pass_name, style in (("forward_backward", "-"), ("forward", "--")):
            ran = [r for r in records if r["backend"] == name and r["pass"] == pass_name and "skipped" not in r]
            if not ran:
                continue
            T = [r["seq_len"] for r in ran]
            label = f"{name} ({'fwd+bwd' if pass_name == 'forward_backward' else 'fwd'})"
            ax_time.plot(T, [r["seconds"] for r in ran], style, marker="o", color=f"C{i}", label=label)
            ax_mem.plot(
                T, [max(r["peak_bytes"], 1) / 2**20 for r in ran], style, marker="o", color=f"C{i}", label=label
            )
    first = records[0]
    for ax, ylabel in ((ax_time, "seconds"), (ax_mem, "peak memory above inputs (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_time.set_title(
        f"attention time, B={first['batch']} H={first['heads']} D={first['head_dim']} float32"
        f"{', causal' if first['causal'] else ''}\n{first['device_name']} ({first['device']})"
    )
    ax_mem.set_title(f"attention peak memory: {first['peak_memory']}")
    ax_mem.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
