"""Where a training step's time goes on a GPU: the step of `attnlab bench train --shape NAME` (with
--compile, its forward and loss compiled together, as the bench and `attnlab train` do) under
torch.profiler, its kernels grouped (matrix products, attention, the loss, the optimiser, the rest),
and the loss alone against the reference's F.cross_entropy on the same logits, eager and compiled.
(Its first GPU run, on an H200 on 2026-11-27, compiled the model alone with the loss eager: that
profile, in docs/performance/gpu_training.md, is of a slower step than the bench's.)

    python docs/experiments/profile_step.py --shape gpt2-small [--compile] [--out DIR]

Prints a short table; with --out, writes the profiler's full kernel table there. A measurement aid
for docs/performance/gpu_training.md, run by gpu_session.sh; nothing imports it.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import torch
import torch.nn.functional as F

from attnlab.bench.shapes import SHAPES, shape_train_config
from attnlab.bench.train import attnlab_step
from attnlab.nn.losses import label_smoothed_nll
from attnlab.train.step import compiled

GROUPS = {  # a kernel's group: the first whose words its name contains
    "attention": ("flash", "fmha", "attention", "sdpa", "efficient"),
    "matmul": ("gemm", "sm90", "cutlass", "matmul", "xmma", "nvjet", "cublas"),
    "loss": ("logsumexp", "log_softmax", "nll", "cross_entropy", "scatter", "gather"),
    "optimizer": ("adam", "multi_tensor", "foreach", "norm_kernel", "clip"),
}


def group_of(name: str) -> str:
    lower = name.lower()
    return next((group for group, words in GROUPS.items() if any(w in lower for w in words)), "other")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def seconds(fn, repeats: int = 10) -> float:
    for _ in range(3):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - t0) / repeats


def profile_step(
    shape_name: str, compile: bool, out: pathlib.Path | None, batch: int, seq_len: int, device: torch.device
) -> None:
    shape = SHAPES[shape_name]
    model = shape.attnlab_model().to(device)
    data = shape.make_batch(batch, seq_len, torch.Generator().manual_seed(0)).to(device)
    objective = compiled(shape.objective) if compile else shape.objective  # the forward and loss, as bench_shape
    step = attnlab_step(model, data, shape_train_config(shape, "bf16"), objective)
    per_step = seconds(step)
    activity = torch.profiler.ProfilerActivity.CUDA if device.type == "cuda" else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        for _ in range(3):
            step()
        sync()
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        us = event.self_device_time_total if device.type == "cuda" else event.self_cpu_time_total
        totals[group_of(event.key)] = totals.get(group_of(event.key), 0.0) + us / 3 / 1e3
    print(
        f"{shape_name} compiled={compile}: {per_step * 1e3:.1f} ms a step (wall); GPU ms a step by group:",
        {group: round(ms, 2) for group, ms in sorted(totals.items(), key=lambda kv: -kv[1])},
    )
    if out is not None:
        sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        (out / f"profile_{shape_name}_{'compiled' if compile else 'eager'}.txt").write_text(
            prof.key_averages().table(sort_by=sort, row_limit=60)
        )


def profile_loss(rows: int, vocab: int, device: torch.device) -> None:
    """Forward + backward of the loss alone on (rows, vocab) bf16 logits, eager and compiled: attnlab's
    (the chunked function eager on a CPU, the expression elsewhere; compiled, as a training step runs
    it) and the reference's F.cross_entropy(logits.float())."""
    x = torch.randn(rows, vocab, device=device, dtype=torch.bfloat16, requires_grad=True)
    y = torch.randint(0, vocab, (rows,), device=device)
    losses = {
        "attnlab": lambda x, y: label_smoothed_nll(x, y, 0.0, -100)[0],
        "F.cross_entropy": lambda x, y: F.cross_entropy(x.float(), y, reduction="sum"),
    }
    losses |= {f"compiled {name}": torch.compile(fn) for name, fn in list(losses.items())}
    print(
        f"loss fwd+bwd on ({rows}, {vocab}) bf16:",
        {name: f"{seconds(lambda fn=fn: fn(x, y).backward()) * 1e3:.2f} ms" for name, fn in losses.items()},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="gpt2-small", choices=sorted(SHAPES))
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    shape, device = SHAPES[args.shape], torch.device(args.device)
    batch, seq_len = args.batch or shape.batch, args.seq_len or shape.seq_len
    profile_step(args.shape, args.compile, args.out, batch, seq_len, device)
    profile_loss(batch * seq_len, -(-shape.model["vocab_size"] // 64) * 64, device)


if __name__ == "__main__":
    main()
