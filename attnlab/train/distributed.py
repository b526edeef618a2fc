"""Several processes, one training run: PyTorch's own DistributedDataParallel under ``torchrun``.

``torchrun --nproc_per_node N -m attnlab.cli train CONFIG --out RUN`` (or the ``attnlab`` script
in place of ``-m attnlab.cli``) starts N copies; each reads RANK / WORLD_SIZE from the environment
and joins a process group (gloo on the CPU, NCCL on GPUs). Every rank builds the same batches of
an epoch and takes its own share of each global batch; DDP averages the gradients, and the loss
is normalised by the token count of the whole global batch, so an update equals the one a single
process would make over all of it. Rank 0 alone logs and writes the run directory; all ranks read
it to resume. Decisions that end training (time limits, early stopping) are taken from values
all ranks share, so that no rank waits for a step the others will not take.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    """This process's place among ``size`` training processes."""

    rank: int
    size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_sum(self, *values: float) -> list[float]:
        """Each value summed over the ranks, in one all-reduce."""
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()

    def all_max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()


def world_from_env(device: str = "cpu") -> World | None:
    """Join the process group that torchrun set up (WORLD_SIZE > 1), or None for one process."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return None
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return World(dist.get_rank(), dist.get_world_size())
