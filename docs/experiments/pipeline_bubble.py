"""The bubble of a pipeline schedule, measured (issue 42): under torchrun with N ranks, a decoder-only
model of 4 equal layers cut into N stages (parallel/pipeline.py) trains one fixed batch of 16 rows of
64 tokens in m micro-batches; for each m and schedule, the median time of a pipelined step
against the time a stage is busy (its forward and backward over the same m micro-batches alone,
no communication, on its own rank). The idle fraction 1 - busy / step is compared with the
formula (N - 1) / (m + N - 1). The slowest stage's busy time counts (it sets the pace).

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 docs/experiments/pipeline_bubble.py

Prints one JSON line per (schedule, m) on rank 0.
"""

from __future__ import annotations

import json
import statistics
import time

import torch
import torch.distributed as dist

from attnlab import build_model, model_config
from attnlab.data.batching import Batch
from attnlab.nn.losses import label_smoothed_nll
from attnlab.parallel.distributed import exit_worker, joined_world
from attnlab.parallel.pipeline import Pipeline
from attnlab.runs.train_config import TrainConfig
from attnlab.tasks.language_model import LanguageModel

ROWS, LENGTH, VOCAB, WIDTH = 16, 64, 64, 128
CFG = TrainConfig(label_smoothing=0.0)
REPEATS = 5


def busy_seconds(pipeline: Pipeline, batch: Batch, m: int) -> float:
    """This rank's stage alone: forward and backward of the m micro-batches (stand-in inputs and
    output gradients of the right shapes where the neighbours would send them)."""
    stage = pipeline.stage
    started = time.perf_counter()
    for ids, targets in zip(batch.tgt_in.chunk(m), batch.tgt_out.chunk(m)):
        x = ids if stage.first else torch.randn(ids.shape[0], LENGTH, WIDTH, requires_grad=True)
        out = stage(x)
        if stage.last:
            label_smoothed_nll(out, targets, 0.0, 0)[0].backward()
        else:
            out[0].backward(torch.randn_like(out[0]))  # the states, the one tensor an LMStage carries
    return time.perf_counter() - started


def main() -> None:
    with joined_world() as world:
        g = torch.Generator().manual_seed(0)
        windows = torch.randint(4, VOCAB, (ROWS, LENGTH + 1), generator=g)
        batch = Batch(None, windows[:, :-1], windows[:, 1:])
        for schedule in ("gpipe", "1f1b"):
            for m in (1, 2, 4, 8, 16) if schedule == "gpipe" else (2, 4, 8, 16):  # 1f1b: m >= N
                torch.manual_seed(0)
                model = build_model(
                    model_config(
                        arch="decoder_lm",
                        vocab_size=VOCAB,
                        d_model=WIDTH,
                        n_heads=4,
                        n_layers=4,
                        d_ff=4 * WIDTH,
                        dropout=0.0,
                        embeddings=dict(tie="none"),
                    )
                )
                pipeline = Pipeline(model, world, LanguageModel, schedule, m, torch.device("cpu"))
                steps, busy = [], []
                for repeat in range(REPEATS + 1):  # the first builds the schedule: not timed
                    world.barrier()
                    started = time.perf_counter()
                    pipeline.accumulate_gradients(pipeline.stage, [batch], CFG)
                    seconds = world.all_max(time.perf_counter() - started)
                    model.zero_grad(set_to_none=True)
                    stage_busy = world.all_max(busy_seconds(pipeline, batch, m))
                    model.zero_grad(set_to_none=True)
                    if repeat:
                        steps.append(seconds)
                        busy.append(stage_busy)
                step, work = statistics.median(steps), statistics.median(busy)
                if world.is_main:
                    print(
                        json.dumps(
                            {
                                "ranks": world.size,
                                "schedule": schedule,
                                "micro_batches": m,
                                "step_s": round(step, 4),
                                "busy_s": round(work, 4),
                                "idle": round(1 - work / step, 3),
                                "formula": round((world.size - 1) / (m + world.size - 1), 3),
                            }
                        ),
                        flush=True,
                    )
        dist.barrier()
    exit_worker(0)


if __name__ == "__main__":
    main()
