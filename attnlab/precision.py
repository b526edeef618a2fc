"""Mixed precision: which one a run uses, and the autocast context that applies it.

``train.precision: auto`` takes bf16 only where the hardware computes in it natively: a CUDA
device that supports it, or a CPU with the AVX512_BF16 or AMX-BF16 instructions. Elsewhere bf16 is
emulated and slow: on an AVX2-only CPU a bf16 matrix product ran about 60x slower than fp32 (1.0
against 57.7 GFLOP/s, issue 15), so ``auto`` takes fp32 there. The choice follows from the
hardware alone, so the same machine always makes the same one; a quick timing of both only goes
into the message that reports it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch

from attnlab.errors import ConfigError

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs with bf16 arithmetic


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (Linux); empty where /proc/cpuinfo is not there."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.partition(":")[2].split())
    return set()


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 at full speed."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    return bool(cpu_flags() & set(NATIVE_BF16_FLAGS))


def matmul_gflops(dtype: torch.dtype, device: torch.device, n: int = 256, repeats: int = 5) -> float:
    """GFLOP/s of an n x n x n matrix product in ``dtype`` (the best of ``repeats``): a check of a
    few milliseconds, for messages only."""
    a = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for _ in range(repeats + 1):  # the first call warms up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ a
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run trains in, and a one-line note to show the user (empty if none)."""

    precision: str
    note: str = ""


def _measured(device: torch.device) -> str:
    bf16, fp32 = matmul_gflops(torch.bfloat16, device), matmul_gflops(torch.float32, device)
    return f"a bf16 matrix product ran at {bf16:.1f} GFLOP/s against {fp32:.1f} in fp32 here"


def choose_precision(requested: str, device: torch.device) -> PrecisionChoice:
    """``auto`` resolved for ``device`` (bf16 where native, else fp32) with a note saying which and
    why; bf16 asked for on hardware without it is kept, with a warning giving the measured cost."""
    native = native_bf16(device)
    where = "this GPU" if device.type == "cuda" else "this CPU"
    if requested == "auto":
        if native:
            return PrecisionChoice("bf16", f"precision auto: bf16 ({where} computes in bf16 natively)")
        return PrecisionChoice("fp32", f"precision auto: fp32 ({where} has no native bf16; {_measured(device)})")
    if requested == "bf16" and not native:
        return PrecisionChoice(
            "bf16",
            f"warning: train.precision is bf16 but {where} has no native bf16: "
            f"{_measured(device)}; use precision auto or fp32",
        )
    return PrecisionChoice(requested)


def autocast(precision: str, device: torch.device) -> Callable[[], ContextManager[Any]]:
    """A factory of autocast contexts for a resolved precision: bf16 on the CPU or CUDA, fp16 on
    CUDA only, fp32 = none."""
    if precision == "fp32":
        return contextlib.nullcontext
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("train.precision 'fp16' needs a CUDA device; use 'auto' or 'bf16' on the CPU")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device.type, dtype=dtype)


def allow_tf32(device: torch.device) -> None:
    """On CUDA, float32 matrix products on the tensor cores in TF32 (10-bit mantissa, float32 range,
    accumulated in float32), which an fp32 run would otherwise leave idle. A process-wide setting;
    nothing on the CPU, whose fp32 figures stay."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # cuDNN's convolutions take TF32 by default already
