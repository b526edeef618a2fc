"""Training speed against the references, in one process, on identical batches.

Shape (issue 8): encoder-decoder, d_model 256, 3+3 layers, 4 heads, d_ff 1024, vocabulary 8000,
dropout 0.1, tied embeddings; batches of 64 pairs of 24 + 24 random tokens; one step is forward,
label-smoothed loss (0.1), backward, clipping at 1.0 and an Adam update. Each implementation runs
the same steps, interleaved (a, b, c, a, b, c, ...), after a warm-up; the figure is the median.

Everything runs on one device (``cpu``, ``cuda:N``): the models, the batch, autocast and the
synchronised timer. Model-FLOPs utilisation (MFU) divides the matrix-multiply FLOPs of one step
(counted by PyTorch's FLOP counter on attnlab's model: the references compute the same products)
by the step time and by the GEMM peak measured on the same device in the same run and precision:
square matrix products (8192 on CUDA, 1024 on the CPU: large enough to reach the peak, small
enough to take milliseconds) timed in turn with the steps, so that a change in the machine's speed
(clocks, heat, neighbours) moves both alike and no datasheet figure is needed.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.analysis.budget import budget_report
from attnlab.bench.device import device_fields
from attnlab.bench.reference import (
    DATA,
    DROPOUT,
    SHAPE,
    TRANSFORMERS_MISSING,
    attnlab_model,
    marian,
    model_config,
    torch_transformer,
)
from attnlab.bench.timing import CPU, interleaved_medians, random_pairs
from attnlab.data.batching import Batch
from attnlab.data.tokenizers import PAD
from attnlab.eval.likelihood import teacher_forced_loss
from attnlab.precision import autocast
from attnlab.runs.train_config import TrainConfig
from attnlab.tasks.batching import Batch as TaskBatch
from attnlab.train.schedules import make_schedule, make_scheduler
from attnlab.train.step import Objective, make_optimizer, train_step

BATCH, LENGTH = 64, 24
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


GEMM_SIZE = {"cpu": 1024, "cuda": 8192}  # by device type: 4096 on an H100 gave 380 to 544 TFLOP/s, run to run


def gemm(precision: str, device: torch.device = CPU, products: int = 4) -> tuple[Callable[[], None], float]:
    """A call of ``products`` n x n x n matrix products in ``precision`` on ``device`` (n from
    GEMM_SIZE), and its FLOPs: timed among the training steps, it gives the GEMM peak of the same
    minutes of machine time."""
    n = GEMM_SIZE[device.type]
    a, b = (torch.randn(n, n, device=device, dtype=DTYPES[precision]) for _ in range(2))  # (n, n) each

    def call() -> None:
        for _ in range(products):
            a @ b

    return call, 2.0 * n**3 * products


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model-FLOPs utilisation: the FLOP/s a step achieved (``flops`` in ``seconds``) as a fraction
    of the ``peak`` FLOP/s."""
    return flops / seconds / peak


def random_batch(seed: int = 0, device: torch.device = CPU) -> Batch:
    """The benchmark's batch on ``device``: sources + EOS, BOS + targets, 24 + 24 tokens."""
    return random_pairs(BATCH, LENGTH - 1, SHAPE["vocab_size"], torch.Generator().manual_seed(seed), device)


def train_config(precision: str) -> TrainConfig:
    """The benchmarks' training settings: Adam at a constant 1e-3, label smoothing 0.1, clipping at 1."""
    return TrainConfig(
        lr_schedule="constant", lr=1e-3, warmup_steps=1, label_smoothing=0.1, clip_norm=1.0, precision=precision
    )


class TrainingStep:
    """One call = one training step of ``model`` with ``optimizer`` (``run`` does it). What the step
    keeps on its device between calls is its state: the model's weights and buffers and the
    optimizer's moments (the gradients are freed at the end of each step)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, run: Callable[[], object]):
        self.model, self.optimizer, self.run = model, optimizer, run

    def __call__(self) -> None:
        self.run()

    def state_bytes(self) -> int:
        """Bytes of the weights, buffers and optimizer state, each storage once (a tied table is one)."""
        moments = (t for state in self.optimizer.state.values() for t in state.values() if torch.is_tensor(t))
        storages = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in (*self.model.parameters(), *self.model.buffers(), *moments)
        }
        return sum(storages.values())


def attnlab_step(
    model: nn.Module, batch: TaskBatch, cfg: TrainConfig, objective: Objective = teacher_forced_loss
) -> TrainingStep:
    """One call = one step of attnlab's own train_step (what `attnlab train` runs) under ``cfg``, with
    the task's ``objective`` and autocast on the device the model is on (the batch must be there too)."""
    optimizer = make_optimizer(model, cfg)
    scheduler = make_scheduler(
        optimizer, make_schedule(cfg.lr_schedule, cfg.lr, cfg.warmup_steps, cfg.max_steps, cfg.min_lr, 1)
    )
    amp = autocast(cast(str, cfg.precision), next(model.parameters()).device)  # the benches' configs set it
    return TrainingStep(
        model, optimizer, lambda: train_step(model, [batch], optimizer, scheduler, cfg, amp, objective=objective)
    )


def cross_entropy(logits: Tensor, targets: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """A reference's loss: (B, T, V) logits, (B, T) targets with PAD where none -> the mean
    (label-smoothed) cross-entropy, in float32."""
    return F.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten(), ignore_index=PAD, label_smoothing=label_smoothing
    )


def reference_step(model: nn.Module, cfg: TrainConfig, loss: Callable[[], Tensor]) -> TrainingStep:
    """The same step for a reference model: its ``loss`` (of its batch) under autocast on the model's
    device, backward, clipping at ``cfg.clip_norm`` and attnlab's optimiser (the same fused update)."""
    optimizer = make_optimizer(model, cfg)
    amp = autocast(cast(str, cfg.precision), next(model.parameters()).device)  # the benches' configs set it

    def step() -> None:
        model.train()
        with amp():
            value = loss()
        value.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cast(float, cfg.clip_norm))  # the benches' configs clip
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return TrainingStep(model, optimizer, step)


def bench_train(
    precisions: tuple[str, ...] = ("fp32", "bf16"),
    repeats: int = 10,
    with_hf: bool = True,
    seed: int = 0,
    device: torch.device = CPU,
) -> Iterator[dict[str, Any]]:
    """Per precision: the GEMM peak, attnlab's tokens/s against each reference (with both MFUs),
    and attnlab's MFU; every record names the device."""
    torch.manual_seed(seed)
    batch = random_batch(seed, device)
    tokens = batch.n_targets
    flops = budget_report(model_config(), DATA, LENGTH, BATCH)["flops"]["forward_backward"]
    where = device_fields(device)
    for precision in precisions:
        models = {"attnlab": attnlab_model(), "torch.nn.Transformer": torch_transformer(DROPOUT)}
        hf = marian(DROPOUT) if with_hf else None
        if hf is not None:
            models["transformers.MarianMTModel"] = hf
        models = {name: model.to(device) for name, model in models.items()}
        cfg = train_config(precision)
        steps: dict[str, Callable[[], None]] = {
            name: attnlab_step(model, batch, cfg)
            if name == "attnlab"
            else reference_step(
                model,
                cfg,
                # the default binds each model (mypy cannot type a lambda with one against Callable[[], Tensor])
                cast(
                    "Callable[[], Tensor]",
                    lambda m=model: cross_entropy(m(batch.src, batch.tgt_in), batch.tgt_out, cfg.label_smoothing),
                ),
            )
            for name, model in models.items()
        }
        steps["gemm"], gemm_flops = gemm(precision, device)
        seconds = interleaved_medians(steps, repeats, device=device)
        peak = gemm_flops / seconds.pop("gemm")
        yield {
            "name": f"gemm_peak_{precision}",
            "value": round(peak / 1e9, 1),
            "unit": "GFLOP/s",
            "gemm_size": GEMM_SIZE[device.type],
        } | where
        ours = tokens / seconds["attnlab"]
        ours_mfu = round(mfu(flops, seconds["attnlab"], peak), 4)
        name = f"train_{precision}"
        for reference in models:
            if reference != "attnlab":
                theirs = tokens / seconds[reference]
                yield {
                    "name": name,
                    "value": round(ours, 1),
                    "unit": "tokens/s",
                    "reference": reference,
                    "reference_value": round(theirs, 1),
                    "ratio": round(ours / theirs, 3),
                    "mfu": ours_mfu,
                    "reference_mfu": round(mfu(flops, seconds[reference], peak), 4),
                } | where
        yield {
            "name": f"{name}_mfu",
            "value": ours_mfu,
            "unit": f"fraction of the {precision} GEMM peak",
            "achieved_gflops": round(flops / seconds["attnlab"] / 1e9, 1),
            "peak_gflops": round(peak / 1e9, 1),
            "flops_per_step": flops,
            "tokens_per_step": tokens,
        } | where
        if hf is None and with_hf:
            yield {"name": name, "reference": "transformers.MarianMTModel", "skipped": TRANSFORMERS_MISSING} | where
