"""Minimal reproductions of what PyTorch 2.13's pipelining and DTensor do on the CPU with gloo that
attnlab's train.strategy pp and tp work around (issue 42).

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 docs/experiments/pipelining_limits.py

1. A new PipelineStage's first step calls the schedule's loss_fn once more than there are
   micro-batches, on placeholder outputs (backward metadata inference), whose value may be NaN:
   a loss that records its values must count only the last m calls (parallel/pipeline.py).
2. A stage's buffers are sized by the first step: a later step whose micro-batches have another
   shape fails in the backward (attnlab builds one schedule per batch shape).
3. A fused Adam step or clip_grad_norm_ over a mix of DTensor and plain parameters (tensor
   parallelism leaves norms and embeddings whole) raises "got mixed torch.Tensor and DTensor"
   (attnlab's optimizer groups and gradient clipping keep the two kinds apart).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.distributed.tensor import Shard, distribute_tensor


def report(what: str, value: object, rank: int = 0) -> None:
    if dist.get_rank() == rank:
        print(f"{what}: {value}", flush=True)


def pipeline_limits(rank: int, n: int) -> None:
    torch.manual_seed(0)
    stage = PipelineStage(nn.Linear(8, 8), rank, n, torch.device("cpu"))
    calls: list[float] = []

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        calls.append(float(((out - target) ** 2).sum()))
        return ((out - target) ** 2).sum()

    schedule = ScheduleGPipe(stage, 2, loss_fn=loss_fn)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    schedule.step(x) if rank == 0 else schedule.step(target=y)
    report("1. loss calls for 2 micro-batches", calls, rank=n - 1)
    try:  # the last: the other rank then waits until the group's timeout
        schedule.step(x[:2]) if rank == 0 else schedule.step(target=y[:2])
        report("2. a second shape", "ran")
    except RuntimeError as err:
        report("2. a second shape", " ".join(str(err).split())[:300])


def mixed_dtensor(n: int) -> None:
    mesh = init_device_mesh("cpu", (n,))
    split = nn.Parameter(distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)]))
    split.grad = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])
    whole = nn.Parameter(torch.randn(3))
    whole.grad = torch.ones(3)
    for what, run in (
        ("clip_grad_norm_", lambda: nn.utils.clip_grad_norm_([split, whole], 1.0)),
        ("fused Adam", lambda: torch.optim.Adam([split, whole], fused=True).step()),
    ):
        try:
            run()
            report(f"3. {what} over DTensor and Tensor", "ran")
        except RuntimeError as err:
            report(f"3. {what} over DTensor and Tensor", str(err).splitlines()[0])


if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    mixed_dtensor(dist.get_world_size())
    dist.barrier()
    pipeline_limits(dist.get_rank(), dist.get_world_size())
    os._exit(0)  # the group is left broken by 2
