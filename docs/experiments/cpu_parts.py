"""Three parts of a training step on this CPU, each against the form it replaced (docs/performance.md).

1. The optimiser update: PyTorch's fused Adam kernel (what attnlab's make_optimizer uses) against
   the per-tensor ``foreach`` one (PyTorch's default), on the character model and on the
   benchmark encoder-decoder, with random gradients.
2. The fused label-smoothed loss, forward + backward on 1,536 x 8,000 logits, with 1,024-row
   chunks (before) and 64-row chunks (now), float32 and bf16.
3. Where one bf16 benchmark step goes: the profiler's top operators.

    .venv/bin/python docs/experiments/cpu_parts.py
"""

import torch
from torch.profiler import profile

import attnlab.train.losses as losses
from attnlab.bench.lm import MODEL, VOCAB
from attnlab.bench.timing import interleaved_medians
from attnlab.bench.train import attnlab_model, attnlab_step, random_batch, train_config
from attnlab.config import ModelConfig
from attnlab.nn.build import build_model


def median_ms(fn, repeats: int = 20, warmup: int = 3) -> float:
    return 1e3 * interleaved_medians({"fn": fn}, repeats, warmup)["fn"]


def optimiser_updates() -> None:
    models = {"character model (0.8M parameters)": build_model(ModelConfig(**MODEL, vocab_size=VOCAB)),
              "benchmark encoder-decoder": attnlab_model()}
    for name, model in models.items():
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        ms = {kind: median_ms(torch.optim.AdamW(model.parameters(), lr=1e-3, **{kind: True}).step)
              for kind in ("foreach", "fused")}
        print(f"AdamW step, {name}: foreach {ms['foreach']:.2f} ms, fused {ms['fused']:.2f} ms")


def loss_chunks() -> None:
    target = torch.randint(4, 8000, (1536,))
    default = losses.CHUNK_ELEMENTS
    try:
        for dtype in (torch.float32, torch.bfloat16):
            logits = torch.randn(1536, 8000).to(dtype)
            for rows in (1024, 64):
                losses.CHUNK_ELEMENTS = rows * 8000

                def step() -> None:
                    x = logits.clone().requires_grad_()
                    loss, _ = losses.label_smoothed_nll(x, target, 0.1, 0)
                    loss.backward()

                print(f"fused loss, {dtype}, {rows}-row chunks: {median_ms(step, repeats=9):.1f} ms forward + backward")
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
