"""Where a command runs its model: ``auto | cpu | cuda | cuda:N``, as ``train.device`` and as every
other command's ``--device``. ``auto`` takes the GPU when there is one.

Under torchrun each process takes the GPU of its local rank (``LOCAL_RANK``, 0 .. the number of
processes on this host - 1): 'cuda' and 'auto' mean cuda:LOCAL_RANK there, so that N processes
on a host with N GPUs use one each, as NCCL requires. A host with fewer GPUs than local ranks is
refused before any process group is joined.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import torch

from attnlab.errors import ConfigError

DEVICE_NAMES = "auto, cpu, cuda or cuda:N"
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_device_name(name: str, option: str = "train.device") -> None:
    if not isinstance(name, str) or not _DEVICE.fullmatch(name):
        raise ConfigError(f"{option} must be {DEVICE_NAMES} (got {name!r})")


def on_gpu(name: str) -> bool:
    """Whether ``name`` runs on a GPU on this host (never refusing: for defaults, not for running)."""
    return name.startswith("cuda") or (name == "auto" and torch.cuda.device_count() > 0)


def local_rank(env: Mapping[str, str] = os.environ) -> int | None:
    """This process's rank on its host under torchrun (LOCAL_RANK), or None for one process."""
    if int(env.get("WORLD_SIZE", "1")) <= 1:
        return None
    return int(env.get("LOCAL_RANK", "0"))


def resolve_device(
    name: str, option: str = "train.device", env: Mapping[str, str] = os.environ, n_gpus: int | None = None
) -> torch.device:
    """The torch.device that ``name`` stands for on this host (``n_gpus``: how many CUDA devices it
    has; by default, torch's count). Refused in one line naming ``option``: a GPU that is not there,
    an explicit cuda:N under torchrun, or fewer GPUs than torchrun's local ranks."""
    check_device_name(name, option)
    n_gpus = torch.cuda.device_count() if n_gpus is None else n_gpus
    if name == "cpu" or (name == "auto" and n_gpus == 0):
        return torch.device("cpu")
    if n_gpus == 0:
        raise ConfigError(
            f"{option} is '{name}' but no CUDA device is available (torch {torch.__version__}, "
            f"CUDA {torch.version.cuda or 'not built in'}); use {option} cpu or auto"
        )
    rank = local_rank(env)
    if rank is not None:
        if name.startswith("cuda:"):
            raise ConfigError(
                f"{option} '{name}' under torchrun would put every rank on one GPU; use cuda or "
                f"auto, and each rank takes the GPU of its LOCAL_RANK"
            )
        if rank >= n_gpus:
            ranks = env.get("LOCAL_WORLD_SIZE", str(rank + 1))
            raise ConfigError(
                f"torchrun started {ranks} processes on this host, which has {n_gpus} GPU(s): one GPU "
                f"per process is needed (LOCAL_RANK {rank}); use --nproc_per_node {n_gpus}, or "
                f"{option} cpu"
            )
        return torch.device("cuda", rank)
    index = int(name.partition(":")[2] or 0)
    if index >= n_gpus:
        raise ConfigError(f"{option} is '{name}' but this host has {n_gpus} GPU(s) (cuda:0 .. cuda:{n_gpus - 1})")
    return torch.device("cuda", index)


def use_device(device: torch.device) -> torch.device:
    """Make ``device`` the current CUDA device (kernels and NCCL of this process go there); returns it."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device
