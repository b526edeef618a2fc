"""The device a benchmark runs on, named in its records.

A figure means something only next to the hardware that produced it: tokens/s on an H100 and on a
laptop CPU differ by orders of magnitude, and so may the ratios against a reference (a library can
be tuned for one and not the other). Every record of `attnlab bench` therefore carries the device
(``cpu``, ``cuda:0``) and its model name, so that two figures are never compared across machines by
mistake. Moving models and batches there is ``.to(device)``; autocast on it is
:func:`attnlab.precision.autocast`; waiting for it is :mod:`attnlab.bench.timing`'s.
"""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path

import torch


@cache
def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform module says, else 'cpu'."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def device_name(device: torch.device) -> str:
    """The GPU's name for a CUDA device (torch.cuda.get_device_name), the CPU's model otherwise."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def device_fields(device: torch.device) -> dict[str, str]:
    """The fields every benchmark record carries: {'device': 'cuda:0', 'device_name': 'NVIDIA H100 ...'}."""
    return {"device": str(device), "device_name": device_name(device)}


# NVIDIA's datasheet figures for dense bf16 tensor-core products (half the "with sparsity" ones), by
# a part of the name torch.cuda.get_device_name gives; the first that matches counts.
PUBLISHED_BF16_PEAK = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H200", 989e12),
    ("H100", 989e12),
    ("A100", 312e12),
)


def published_bf16_peak(device: torch.device) -> float | None:
    """The device's published dense bf16 peak in FLOP/s, or None where none is known (every CPU)."""
    if device.type != "cuda":
        return None
    name = device_name(device)
    return next((peak for part, peak in PUBLISHED_BF16_PEAK if part in name), None)
