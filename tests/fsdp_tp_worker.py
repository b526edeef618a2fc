"""Run under torchrun (4 ranks) by tests/test_parallel.py: tp_worker's gradients and clipped update
of a tiny model of each family named, under train.strategy fsdp+tp (dp 2 x tp 2, each dp rank one of
the two batches), and the same computed whole in rank 0 alone over both batches."""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

from attnlab.parallel.distributed import exit_worker, joined_world
from attnlab.train.strategy import FullyShardedTensorParallel

from tp_worker import CFG, model, update

if __name__ == "__main__":
    out, families = sys.argv[1], sys.argv[2:]
    results = {}
    with joined_world() as world:
        for arch in families:
            strategy = FullyShardedTensorParallel(replace(CFG, strategy="fsdp+tp", tensor_parallel=2), world)
            split = strategy.prepare(model(arch), torch.device("cpu"))
            results[arch] = {"tp": update(split, arch, strategy.data_world)}
            if world.is_main:
                results[arch]["one"] = update(model(arch), arch)
    if world.is_main:
        torch.save(results, out)
    exit_worker(0)
