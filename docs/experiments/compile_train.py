"""Does ``train.compile`` (torch.compile of the training forward) help on this CPU? (docs/performance/cpu.md)

Times attnlab's own training step (bench.train.attnlab_step: forward, loss, backward, clipping,
the optimiser) eagerly and on ``torch.compile(model)``, which is what ``train.compile: true``
trains, for the character model (batch 12 x 64, AdamW) and the benchmark encoder-decoder (64 pairs
of 24 + 24 tokens, Adam), in float32 and bf16. After compiling (the first two compiled steps,
whose time is reported) the two steps take turns, and the medians are compared.

    .venv/bin/python docs/experiments/compile_train.py
"""

import time

import torch

from attnlab.bench.lm import lm_batch, lm_model, lm_train_config
from attnlab.bench.reference import attnlab_model
from attnlab.bench.timing import interleaved_medians
from attnlab.bench.train import attnlab_step, random_batch, train_config


def setup(which: str, precision: str):
    torch.manual_seed(0)
    if which == "character model":
        return lm_model(), lm_batch(torch.Generator().manual_seed(0)), lm_train_config(precision)
    return attnlab_model(), random_batch(0), train_config(precision)


def main() -> None:
    for which, n in (("character model", 30), ("benchmark encoder-decoder", 8)):
        for precision in ("fp32", "bf16"):
            model, batch, cfg = setup(which, precision)
            eager = attnlab_step(model, batch, cfg)
            compiled = attnlab_step(torch.compile(model), batch, cfg)
            start = time.perf_counter()
            compiled(), compiled()
            compile_s = time.perf_counter() - start
            ms = {
                k: 1e3 * v for k, v in interleaved_medians({"eager": eager, "compiled": compiled}, n, warmup=3).items()
            }
            print(
                f"{which}, {precision}: eager {ms['eager']:.1f} ms/step, compiled {ms['compiled']:.1f} ms/step "
                f"(x{ms['eager'] / ms['compiled']:.2f}); compiling took {compile_s:.1f} s"
            )
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
