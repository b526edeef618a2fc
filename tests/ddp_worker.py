"""Run under torchrun by tests/test_distributed.py: one DDP update (a plain SGD step) of a tiny model
on this rank's share of a fixed global batch; rank 0 saves the gradients, the updated weights and
whether it left the process group before exiting."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from attnlab import build_model
from attnlab.data.batching import collate_pairs
from attnlab.parallel.distributed import exit_worker, joined_world
from attnlab.runs.train_config import TrainConfig
from attnlab.train.schedules import make_schedule, make_scheduler
from attnlab.train.step import accumulate_gradients, train_step

from helpers import sized

CFG = TrainConfig(lr_schedule="constant", lr=0.1, warmup_steps=1, label_smoothing=0.1, clip_norm=None)


def setup():
    """The model and the 4 batches of the global batch (lengths differ, so token counts differ)."""
    torch.manual_seed(0)
    model = build_model(*sized(vocab_size=30, stack=dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0)))
    g = torch.Generator().manual_seed(1)
    batches = []
    for b in range(4):
        pairs = [
            (
                torch.randint(4, 30, (3 + b + i,), generator=g).tolist(),
                torch.randint(4, 30, (2 + 2 * b + i,), generator=g).tolist(),
            )
            for i in range(3)
        ]
        batches.append(collate_pairs(pairs))
    return model, batches


def update(model, batches, world=None):
    """Gradients of the loss over ``batches``, then one full train_step on them: (grads, parameters).

    The step is plain SGD, w - lr * g (lr = CFG.lr), not train_step's usual Adam: SGD's result
    follows from the gradients within float32 rounding, so the test can bound the difference,
    and it is proportional to the gradients' scale, so a wrong world-size or token-count factor
    shows (Adam's first step, lr * g / (|g| + eps), is blind to the scale). Adam's own step is
    ill-conditioned here: the key bias has an exact gradient of 0 (adding a constant to every score
    of a row leaves the softmax unchanged), so its computed gradient is rounding noise whose sign
    depends on the summation order (2 ranks vs 1 process, thread counts), and Adam turns it into
    +-lr."""
    trained = DDP(model) if world else model
    accumulate_gradients(trained, batches, CFG, world=world)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=CFG.lr)
    optimizer.zero_grad(set_to_none=True)
    scheduler = make_scheduler(optimizer, make_schedule("constant", CFG.lr, 1, 10, 0.0, 1))
    train_step(trained, batches, optimizer, scheduler, CFG, world=world)
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


if __name__ == "__main__":
    out, per_rank = sys.argv[1], int(sys.argv[2])
    with joined_world() as world:
        model, batches = setup()
        mine = batches[world.rank * per_rank : (world.rank + 1) * per_rank]
        grads, weights = update(model, mine, world)
    if world.is_main:
        torch.save({"grads": grads, "weights": weights, "left_group": not dist.is_initialized()}, out)
    exit_worker(0)
