"""Run under torchrun by tests/test_distributed.py: one DDP update of a tiny model on this rank's
share of a fixed global batch; rank 0 saves the gradients, the updated weights and whether it
left the process group before exiting."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from attnlab import ModelConfig, build_model
from attnlab.config import TrainConfig
from attnlab.data.batching import collate_pairs
from attnlab.train.distributed import exit_worker, joined_world
from attnlab.train.loop import accumulate_gradients, make_optimizer, train_step
from attnlab.train.schedules import make_schedule, make_scheduler

CFG = TrainConfig(lr_schedule="constant", lr=1e-3, warmup_steps=1, label_smoothing=0.1, clip_norm=None)


def setup():
    """The model and the 4 batches of the global batch (lengths differ, so token counts differ)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0))
    g = torch.Generator().manual_seed(1)
    batches = []
    for b in range(4):
        pairs = [(torch.randint(4, 30, (3 + b + i,), generator=g).tolist(),
                  torch.randint(4, 30, (2 + 2 * b + i,), generator=g).tolist()) for i in range(3)]
        batches.append(collate_pairs(pairs))
    return model, batches


def update(model, batches, world=None):
    """Gradients of the loss over ``batches``, then one full train_step on them: (grads, weights)."""
    trained = DDP(model) if world else model
    accumulate_gradients(trained, batches, CFG, world=world)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    optimizer = make_optimizer(model, CFG)
    optimizer.zero_grad(set_to_none=True)
    scheduler = make_scheduler(optimizer, make_schedule("constant", 1e-3, 1, 10, 0.0, 1))
    train_step(trained, batches, optimizer, scheduler, CFG, world=world)
    return grads, {k: v.clone() for k, v in model.state_dict().items()}


if __name__ == "__main__":
    out, per_rank = sys.argv[1], int(sys.argv[2])
    with joined_world() as world:
        model, batches = setup()
        mine = batches[world.rank * per_rank:(world.rank + 1) * per_rank]
        grads, weights = update(model, mine, world)
    if world.is_main:
        torch.save({"grads": grads, "weights": weights, "left_group": not dist.is_initialized()}, out)
    exit_worker(0)
