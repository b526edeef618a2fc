"""Several processes, one training run under ``torchrun``: each process's place in the group
(``World``), joining and leaving it, and tensors split across the ranks (DTensors) made whole. How
the ranks share the work (``train.strategy``: DDP, FSDP2, tensor or pipeline parallelism) is
train/strategy.py's.

``torchrun --nproc_per_node N -m attnlab.cli train CONFIG --out RUN`` (or the ``attnlab`` script
in place of ``-m attnlab.cli``) starts N copies; each reads RANK / WORLD_SIZE from the environment
and joins a process group (gloo on the CPU, NCCL on GPUs). Rank 0 alone logs and writes the run
directory; all ranks read it to resume. Decisions that end training (time limits, early stopping)
are taken from values all ranks share, so that no rank waits for a step the others will not take.

Leaving: every rank destroys the group it joined (``joined_world``) and then ends with
``exit_worker``, which skips the interpreter's shutdown. DDP keeps the gloo group alive past
``destroy_process_group`` (PyTorch 2.13), so its worker threads are never joined; one that releases a
finished collective's tensor while the interpreter shuts down needs the GIL, cannot take it, and
aborts the process ("terminate called without an active exception", SIGABRT) after the work is
done. That happened in 1 of 40 and 1 of 80 runs of tests/ddp_worker.py on a loaded 2-core machine
(docs/experiments/ddp_exit_stress.py); the backtrace of the core dump shows
ProcessGroupGloo::runLoop freeing an AsyncAllreduceWork during Py_FinalizeEx.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeGuard, cast

import torch
import torch.distributed as dist
from torch import Tensor

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

STRATEGIES = ("ddp", "fsdp", "tp", "pp", "fsdp+tp")  # train/strategy.py: how the ranks share a run
PIPELINE_SCHEDULES = ("gpipe", "1f1b")  # parallel/pipeline.py
# torch.distributed's checkpoint, FSDP and DTensor modules are imported where they are used: at
# import they cost every `attnlab` process about 0.8 s (of ~2 s), and only a sharded run needs them.
# A tensor can only be a DTensor once that module is imported, which is what is_dtensor checks.
DTENSOR = "torch.distributed.tensor"


@dataclass(frozen=True)
class World:
    """This process's place among ``size`` training processes."""

    rank: int
    size: int
    device: torch.device = torch.device("cpu")  # where collectives' tensors live: NCCL takes only the rank's GPU
    group: Any = None  # the process group of these ranks (None: all of them); rank and size are within it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_sum(self, *values: float) -> list[float]:
        """Each value summed over the ranks, in one all-reduce."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=self.group)
        return t.tolist()

    def all_sum_tensor(self, values: Tensor) -> Tensor:
        """A tensor on this rank's device summed over the ranks, on the device: nothing read on the host."""
        values = values.clone()
        dist.all_reduce(values, group=self.group)
        return values

    def all_max(self, *values: float) -> list[float]:
        """Each value's maximum over the ranks, in one all-reduce."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t.tolist()

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        box = [value]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        return box[0]

    def barrier(self) -> None:
        dist.barrier(group=self.group)


def under_torchrun() -> bool:
    """Whether this process is one of several that torchrun started (WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


@contextmanager
def joined_world(device: torch.device = torch.device("cpu")) -> Iterator[World | None]:
    """This rank's place in the process group that torchrun set up, or None for one process: over
    NCCL when ``device`` is this rank's GPU (attnlab/device.py's ``resolve_device`` maps LOCAL_RANK to
    it), gloo on the CPU. A group joined here is destroyed on the way out, whether the body ends or
    raises; one that the caller had already initialised is left to the caller."""
    if not under_torchrun():
        yield None
        return
    joined_here = not dist.is_initialized()
    if joined_here:
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    try:
        yield World(dist.get_rank(), dist.get_world_size(), device)
    finally:
        if joined_here:
            dist.destroy_process_group()


def is_dtensor(t: object) -> TypeGuard[DTensor]:
    dtensor = sys.modules.get(DTENSOR)
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def whole(t: Tensor) -> Tensor:
    """A sharded tensor gathered from every rank (a collective); any other tensor as it is."""
    return t.full_tensor() if is_dtensor(t) else t


def placed_like(own: dict[str, Tensor], state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Whole tensors of ``state`` (on every rank) split as the model's own state dict ``own`` is, for
    load_state_dict."""
    if not any(is_dtensor(t) for t in own.values()):
        return state
    from torch.distributed.tensor import distribute_tensor

    return {  # own[name] is a DTensor where is_dtensor says so (mypy narrows no own.get(name) to it)
        name: distribute_tensor(
            t.to(own[name].device), cast("DTensor", own[name]).device_mesh, cast("DTensor", own[name]).placements
        )
        if is_dtensor(own.get(name))
        else t
        for name, t in state.items()
    }


def exit_worker(code: int) -> NoReturn:
    """End this torchrun worker with exit status ``code`` without the interpreter's shutdown, whose
    race with gloo's worker threads can abort the process (see the module's docstring). Standard
    output and error are flushed first; files must already be closed, as ``fit`` leaves them."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
