"""Training speed against the references, in one process, on identical batches.

Shape (issue 8): encoder-decoder, d_model 256, 3+3 layers, 4 heads, d_ff 1024, vocabulary 8000,
dropout 0.1, tied embeddings; batches of 64 pairs of 24 + 24 random tokens; one step is forward,
label-smoothed loss (0.1), backward, clipping at 1.0 and an Adam update. Each implementation runs
the same steps, interleaved (a, b, c, a, b, c, ...), after a warm-up; the figure is the median.

Model-FLOPs utilisation divides the matrix-multiply FLOPs of one step (counted by PyTorch's FLOP
counter on attnlab's model: the references compute the same products) by the step time and by the
GEMM peak measured in the same run: square matrix products timed in turn with the steps, so that
a change in the machine's speed moves both alike.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.analysis.budget import budget_report
from attnlab.bench.reference import SHAPE, marian, torch_transformer
from attnlab.bench.timing import interleaved_medians, random_pairs
from attnlab.data.batching import Batch
from attnlab.data.tokenizers import PAD
from attnlab.models import EncoderDecoderConfig, build_model
from attnlab.train.config import TrainConfig
from attnlab.train.step import make_optimizer, train_step
from attnlab.train.precision import autocast
from attnlab.train.schedules import make_schedule, make_scheduler

BATCH, LENGTH, DROPOUT = 64, 24, 0.1
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def gemm(precision: str, n: int = 1024, products: int = 4) -> tuple[Callable[[], None], float]:
    """A call of ``products`` n x n x n matrix products in ``precision``, and its FLOPs: timed among
    the training steps, it gives the GEMM peak of the same minutes of machine time."""
    a = torch.randn(n, n, dtype=DTYPES[precision])
    b = torch.randn(n, n, dtype=DTYPES[precision])

    def call() -> None:
        for _ in range(products):
            a @ b

    return call, 2.0 * n**3 * products


def random_batch(seed: int = 0) -> Batch:
    """The benchmark's batch: sources + EOS, BOS + targets, 24 + 24 tokens."""
    return random_pairs(BATCH, LENGTH - 1, SHAPE["vocab_size"], torch.Generator().manual_seed(seed))


def model_config(dropout: float = DROPOUT) -> EncoderDecoderConfig:
    """The benchmark's model: sinusoidal positions and tied embeddings are the config's defaults."""
    return EncoderDecoderConfig(**SHAPE, dropout=dropout)


def attnlab_model(dropout: float = DROPOUT) -> nn.Module:
    return build_model(model_config(dropout))


def train_config(precision: str) -> TrainConfig:
    """The benchmarks' training settings: Adam at a constant 1e-3, label smoothing 0.1, clipping at 1."""
    return TrainConfig(lr_schedule="constant", lr=1e-3, warmup_steps=1, label_smoothing=0.1, clip_norm=1.0,
                       precision=precision)


def attnlab_step(model: nn.Module, batch: Batch, cfg: TrainConfig) -> Callable[[], None]:
    """One call = one step of attnlab's own train_step (what `attnlab train` runs) under ``cfg``."""
    optimizer = make_optimizer(model, cfg)
    scheduler = make_scheduler(optimizer, make_schedule(cfg.lr_schedule, cfg.lr, cfg.warmup_steps, cfg.max_steps,
                                                        cfg.min_lr, 1))
    amp = autocast(cfg.precision, torch.device("cpu"))
    return lambda: train_step(model, [batch], optimizer, scheduler, cfg, amp)


def reference_step(model: nn.Module, batch: Batch, precision: str) -> Callable[[], None]:
    """The same step for a reference model: autocast, F.cross_entropy with label smoothing in fp32,
    clipping, Adam."""
    cfg = train_config(precision)
    optimizer = make_optimizer(model, cfg)
    amp = autocast(precision, torch.device("cpu"))

    def step() -> None:
        model.train()
        with amp():
            logits = model(batch.src, batch.tgt_in)
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD,
                               label_smoothing=cfg.label_smoothing)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def bench_train(precisions: tuple[str, ...] = ("fp32", "bf16"), repeats: int = 10, with_hf: bool = True,
                seed: int = 0) -> Iterator[dict]:
    torch.manual_seed(seed)
    batch = random_batch(seed)
    tokens = batch.n_tokens
    flops = budget_report(model_config(), LENGTH, BATCH)["flops"]["forward_backward"]
    for precision in precisions:
        models = {"attnlab": attnlab_model(), "torch.nn.Transformer": torch_transformer(DROPOUT)}
        hf = marian(DROPOUT) if with_hf else None
        if hf is not None:
            models["transformers.MarianMTModel"] = hf
        steps = {name: attnlab_step(model, batch, train_config(precision)) if name == "attnlab"
                 else reference_step(model, batch, precision) for name, model in models.items()}
        steps["gemm"], gemm_flops = gemm(precision)
        seconds = interleaved_medians(steps, repeats)
        peak = gemm_flops / seconds.pop("gemm")
        yield {"name": f"gemm_peak_{precision}", "value": round(peak / 1e9, 1), "unit": "GFLOP/s"}
        ours = tokens / seconds["attnlab"]
        name = f"train_{precision}"
        for reference in models:
            if reference != "attnlab":
                theirs = tokens / seconds[reference]
                yield {"name": name, "value": round(ours, 1), "unit": "tokens/s", "reference": reference,
                       "reference_value": round(theirs, 1), "ratio": round(ours / theirs, 3),
                       "reference_mfu": round(flops / seconds[reference] / peak, 3)}
        yield {"name": f"{name}_mfu", "value": round(flops / seconds["attnlab"] / peak, 3),
               "unit": f"fraction of the {precision} GEMM peak", "flops_per_step": flops, "tokens_per_step": tokens}
        if hf is None and with_hf:
            yield {"name": name, "reference": "transformers.MarianMTModel",
                   "skipped": "transformers is not installed (pip install 'attnlab[bench]')"}
