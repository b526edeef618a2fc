"""Run under torchrun by tests/test_parallel.py: for each case TASK/SCHEDULE/M given, the gradients
and one clipped plain-SGD update of a tiny model of the task's family (decoder-only for
language_model, encoder-only for masked_lm and classification, encoder-decoder for translation: 1
encoder layer and 4 decoder layers, so that on 2 ranks the decoder starts inside the first stage
and on 4 the memory passes through two middle stages) cut into one pipeline stage per rank
(parallel/pipeline.py) under that schedule and micro-batch count, and the same in rank 0 alone
accumulating the same micro-batches with the task's own loss; rank 0 saves them by case."""

from __future__ import annotations

import dataclasses
import sys

import torch
import torch.distributed as dist

from attnlab import build_model
from attnlab.data.batching import Batch
from attnlab.data.tokenizers import MASK, PAD
from attnlab.parallel.distributed import exit_worker, joined_world
from attnlab.parallel.pipeline import Pipeline
from attnlab.runs.train_config import TrainConfig
from attnlab.tasks.classification import ClassBatch, Classification
from attnlab.tasks.language_model import LanguageModel
from attnlab.tasks.masked_lm import MaskedLM, MLMBatch
from attnlab.tasks.translation import Translation
from attnlab.train.schedules import make_schedule, make_scheduler
from attnlab.train.step import accumulate_gradients, train_step

from helpers import sized

CFG = TrainConfig(lr_schedule="constant", lr=0.1, warmup_steps=1, label_smoothing=0.1, clip_norm=0.5)
N_LAYERS = 4
SIZES = dict(vocab_size=30, embeddings=dict(tie="none"))
STACK = dict(d_model=16, n_heads=2, d_ff=32, dropout=0.0, norm="pre")


def model(task: type) -> torch.nn.Module:
    torch.manual_seed(0)
    if task is LanguageModel:
        return build_model(*sized(arch="decoder_lm", stack=dict(STACK, n_layers=N_LAYERS), **SIZES))
    if task is Translation:
        return build_model(*sized(arch="encoder_decoder", stack=STACK, depths=dict(encoder=1, decoder=4), **SIZES))
    # 3 layers over 2 ranks: stages of 2 and 1; segments and mean pooling read the real tokens
    return build_model(
        *sized(
            arch="encoder_only",
            stack=dict(STACK, n_layers=3),
            n_classes=3,
            n_segments=2,
            classifier=dict(pooling="mean"),
            **SIZES,
        )
    )


def padded(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(4, 7) ids of rows 7, 5, 6 and 3 tokens long, PAD after; (4, 7) True at real tokens."""
    real = torch.arange(7) < torch.tensor([[7], [5], [6], [3]])
    return torch.where(real, torch.randint(5, 30, (4, 7), generator=g), PAD), real


def batches(task: type) -> list:
    """Two batches of 4 rows: language-model windows of 6 tokens, or padded rows of 7 with about
    half their tokens masked (masked_lm), or with two segments and a class (classification), or
    padded sources and targets (translation)."""
    g = torch.Generator().manual_seed(1)
    if task is LanguageModel:
        windows = [torch.randint(4, 30, (4, 7), generator=g) for _ in range(2)]
        return [Batch(None, w[:, :-1], w[:, 1:]) for w in windows]
    out = []
    for _ in range(2):
        ids, real = padded(g)
        if task is Translation:
            tgt, _ = padded(g)
            out.append(Batch(ids, tgt[:, :-1], tgt[:, 1:]))
        elif task is MaskedLM:
            chosen = real & (torch.rand(ids.shape, generator=g) < 0.5)
            out.append(MLMBatch(torch.where(chosen, MASK, ids), torch.where(chosen, ids, PAD)))
        else:
            segments = (real & (torch.arange(7) >= 3)).long()
            out.append(ClassBatch(ids, segments, torch.randint(0, 3, (4,), generator=g)))
    return out


def micro(data: list, m: int) -> list:
    """Each batch's rows cut into m consecutive micro-batches, as the pipeline's schedule cuts them."""
    return [
        type(b)(*parts)
        for b in data
        for parts in zip(
            *(
                getattr(b, f.name).chunk(m) if getattr(b, f.name) is not None else [None] * m
                for f in dataclasses.fields(b)
            )
        )
    ]


def sgd(params):
    optimizer = torch.optim.SGD(params, lr=CFG.lr)
    return optimizer, make_scheduler(optimizer, make_schedule("constant", CFG.lr, 1, 10, 0.0, 1))


def grad(p: torch.nn.Parameter) -> torch.Tensor:
    """The gradient, zeros where none reached it (the head a task does not read)."""
    return p.grad.clone() if p.grad is not None else torch.zeros_like(p)


def case(world, task: type, schedule: str, m: int) -> dict | None:
    whole = model(task)
    made = task.config().task  # the task, made from its data section's defaults
    pipeline = Pipeline(whole, world, made, schedule, m, torch.device("cpu"))
    sums = pipeline.accumulate_gradients(pipeline.stage, batches(task), CFG)
    grads = {}
    for (name, p), (_, owner) in zip(whole.named_parameters(), pipeline.owners):
        g = grad(p) if owner == world.rank else torch.zeros_like(p)
        dist.broadcast(g, src=owner)
        grads[name] = g
    optimizer, scheduler = sgd(pipeline.stage.parameters())
    optimizer.zero_grad(set_to_none=True)
    step = train_step(
        pipeline.stage,
        batches(task),
        optimizer,
        scheduler,
        CFG,
        accumulate=pipeline.accumulate_gradients,
        clip=pipeline.clip_gradients,
    )
    pipeline.assemble()
    if not world.is_main:
        return None
    reference = model(task)
    one = accumulate_gradients(reference, micro(batches(task), m), CFG, objective=made.loss)
    one_grads = {n: grad(p) for n, p in reference.named_parameters()}
    optimizer, scheduler = sgd(reference.parameters())
    optimizer.zero_grad(set_to_none=True)
    one_step = train_step(reference, micro(batches(task), m), optimizer, scheduler, CFG, objective=made.loss)
    return {
        "pp": {
            "loss": sums["loss_sum"],
            "grads": grads,
            "grad_norm": step["grad_norm"],
            "weights": {n: p.detach().clone() for n, p in whole.named_parameters()},
        },
        "one": {
            "loss": one["loss_sum"],
            "grads": one_grads,
            "grad_norm": one_step["grad_norm"],
            "weights": {n: p.detach().clone() for n, p in reference.named_parameters()},
        },
    }


if __name__ == "__main__":
    tasks = {t.name: t for t in (LanguageModel, MaskedLM, Classification, Translation)}
    out, cases = sys.argv[1], sys.argv[2:]
    results = {}
    with joined_world() as world:
        for spec in cases:  # TASK/SCHEDULE/M
            name, schedule, m = spec.split("/")
            results[spec] = case(world, tasks[name], schedule, int(m))
        if world.is_main:
            torch.save(results, out)
    exit_worker(0)
