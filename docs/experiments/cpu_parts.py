"""Three parts of a training step on this CPU, each against the form it replaced (docs/performance/cpu.md).

1. The optimiser update: PyTorch's fused kernel, as attnlab's make_optimizer builds it, against
   the per-tensor ``foreach`` one (PyTorch's default) over the same parameter groups, on the
   character model (AdamW) and on the benchmark encoder-decoder (Adam), with random gradients.
2. The fused label-smoothed loss, forward + backward on 1,536 x 8,000 logits, with 1,024-row
   chunks (before) and 64-row chunks (now), float32 and bf16.
3. Where one bf16 benchmark step goes: the profiler's top operators.

The two forms of 1 and of 2 take turns (interleaved_medians), so a change in the machine's speed
falls on both.

    .venv/bin/python docs/experiments/cpu_parts.py
"""

import torch
from torch.profiler import profile

import attnlab.nn.losses as losses
from attnlab.bench.lm import lm_model, lm_train_config
from attnlab.bench.reference import attnlab_model
from attnlab.bench.timing import interleaved_medians
from attnlab.bench.train import attnlab_step, random_batch, train_config
from attnlab.train.step import make_optimizer


def milliseconds(fns: dict, repeats: int, warmup: int = 3) -> dict[str, float]:
    return {name: 1e3 * s for name, s in interleaved_medians(fns, repeats, warmup).items()}


def optimiser_updates() -> None:
    models = {
        "character model (0.8M parameters)": (lm_model(), lm_train_config()),
        "benchmark encoder-decoder": (attnlab_model(), train_config("fp32")),
    }
    for name, (model, cfg) in models.items():
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        fused = make_optimizer(model, cfg)
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in fused.param_groups]
        foreach = type(fused)(groups, lr=1.0, betas=fused.defaults["betas"], eps=fused.defaults["eps"], foreach=True)
        ms = milliseconds({"foreach": foreach.step, "fused": fused.step}, 20)
        print(f"{type(fused).__name__} step, {name}: foreach {ms['foreach']:.2f} ms, fused {ms['fused']:.2f} ms")


def loss_chunks() -> None:
    target = torch.randint(4, 8000, (1536,))
    default = losses.CHUNK_ELEMENTS

    def step(logits: torch.Tensor, rows: int):
        def run() -> None:
            losses.CHUNK_ELEMENTS = rows * 8000
            loss, _ = losses.label_smoothed_nll(logits, target, 0.1, 0)
            torch.autograd.grad(loss, logits)

        return run

    try:
        for dtype in (torch.float32, torch.bfloat16):
            logits = torch.randn(1536, 8000).to(dtype).requires_grad_()
            ms = milliseconds({rows: step(logits, rows) for rows in (1024, 64)}, 9)
            for rows, value in ms.items():
                print(f"fused loss, {dtype}, {rows}-row chunks: {value:.1f} ms forward + backward")
    finally:
        losses.CHUNK_ELEMENTS = default


def bf16_step_profile() -> None:
    torch.manual_seed(0)
    step = attnlab_step(attnlab_model(), random_batch(0), train_config("bf16"))
    for _ in range(3):
        step()
    with profile() as prof:
        for _ in range(3):
            step()
    print("one bf16 benchmark step, profiled over 3 steps:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    optimiser_updates()
    loss_chunks()
    bf16_step_profile()
