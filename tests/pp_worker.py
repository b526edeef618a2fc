"""Run under torchrun by tests/test_parallel.py: the gradients and one clipped plain-SGD update of a
tiny decoder-only model cut into one pipeline stage per rank (train/pipeline.py) under a schedule
and a micro-batch count, and the same in rank 0 alone accumulating the same micro-batches; rank 0
saves both."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from attnlab import build_model, model_config
from attnlab.data.batching import Batch
from attnlab.train.config import TrainConfig
from attnlab.train.distributed import exit_worker, joined_world
from attnlab.train.pipeline import Pipeline
from attnlab.train.schedules import make_schedule, make_scheduler
from attnlab.train.step import accumulate_gradients, train_step

CFG = TrainConfig(lr_schedule="constant", lr=0.1, warmup_steps=1, label_smoothing=0.1, clip_norm=0.5)
N_LAYERS = 4


def model():
    torch.manual_seed(0)
    return build_model(model_config(arch="decoder_lm", vocab_size=30, stack=dict(d_model=16, n_heads=2, n_layers=N_LAYERS, d_ff=32, dropout=0.0, norm="pre"), tie_embeddings="none"))


def batches() -> list[Batch]:
    """Two language-model batches of 4 windows of 6 tokens."""
    g = torch.Generator().manual_seed(1)
    windows = [torch.randint(4, 30, (4, 7), generator=g) for _ in range(2)]
    return [Batch(None, w[:, :-1], w[:, 1:]) for w in windows]


def micro(data: list[Batch], m: int) -> list[Batch]:
    """Each batch's rows cut into m consecutive micro-batches, as the pipeline's schedule cuts them."""
    return [Batch(None, i, o) for b in data for i, o in zip(b.tgt_in.chunk(m), b.tgt_out.chunk(m))]


def sgd(params):
    optimizer = torch.optim.SGD(params, lr=CFG.lr)
    return optimizer, make_scheduler(optimizer, make_schedule("constant", CFG.lr, 1, 10, 0.0, 1))


if __name__ == "__main__":
    out, schedule, m = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with joined_world() as world:
        whole = model()
        pipeline = Pipeline(whole, world, schedule, m, torch.device("cpu"))
        sums = pipeline.accumulate_gradients(pipeline.stage, batches(), CFG)
        grads = {}
        for (name, p), (_, owner) in zip(whole.named_parameters(), pipeline.owners):
            g = p.grad.clone() if owner == world.rank else torch.zeros_like(p)
            dist.broadcast(g, src=owner)
            grads[name] = g
        optimizer, scheduler = sgd(pipeline.stage.parameters())
        optimizer.zero_grad(set_to_none=True)
        step = train_step(pipeline.stage, batches(), optimizer, scheduler, CFG,
                          accumulate=pipeline.accumulate_gradients, clip=pipeline.clip_gradients)
        pipeline.assemble()
        if world.is_main:
            reference = model()
            one = accumulate_gradients(reference, micro(batches(), m), CFG)
            one_grads = {n: p.grad.clone() for n, p in reference.named_parameters()}
            optimizer, scheduler = sgd(reference.parameters())
            optimizer.zero_grad(set_to_none=True)
            one_step = train_step(reference, micro(batches(), m), optimizer, scheduler, CFG)
            torch.save({"pp": {"loss": sums["loss_sum"], "grads": grads, "grad_norm": step["grad_norm"],
                               "weights": {n: p.detach().clone() for n, p in whole.named_parameters()}},
                        "one": {"loss": one["loss_sum"], "grads": one_grads, "grad_norm": one_step["grad_norm"],
                                "weights": {n: p.detach().clone() for n, p in reference.named_parameters()}}}, out)
    exit_worker(0)
