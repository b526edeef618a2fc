"""Does ``train.compile`` (torch.compile of the training forward) help on this CPU? (docs/performance.md)

Times attnlab's own training step (bench.train.attnlab_step: forward, loss, backward, clipping,
AdamW) eagerly, then on ``torch.compile(model)``, which is what ``train.compile: true`` trains, for
the character model (batch 12 x 64) and the benchmark encoder-decoder (64 pairs of 24 + 24
tokens), in float32 and bf16. Reports the medians and the compilation time (the first two
compiled steps).

    .venv/bin/python docs/experiments/compile_train.py
"""

import time

import torch

from attnlab.bench.lm import BATCH, BLOCK, MODEL, VOCAB
from attnlab.bench.timing import interleaved_medians
from attnlab.bench.train import attnlab_model, attnlab_step, random_batch, train_config
from attnlab.config import ModelConfig, TrainConfig
from attnlab.data.batching import Batch
from attnlab.nn.build import build_model


def setup(which: str, precision: str):
    torch.manual_seed(0)
    if which == "character model":
        model = build_model(ModelConfig(**MODEL, vocab_size=VOCAB))
        window = torch.randint(4, VOCAB, (BATCH, BLOCK + 1), generator=torch.Generator().manual_seed(0))
        batch = Batch(src=None, tgt_in=window[:, :-1], tgt_out=window[:, 1:])
        cfg = TrainConfig(optimizer="adamw", lr_schedule="constant", lr=1e-3, warmup_steps=1, label_smoothing=0.0,
                          weight_decay=0.1, beta2=0.99, precision=precision)
        return model, batch, cfg
    return attnlab_model(), random_batch(0), train_config(precision)


def median_ms(step, n: int) -> float:
    return 1e3 * interleaved_medians({"step": step}, n, warmup=0)["step"]


def main() -> None:
    for which, n in (("character model", 30), ("benchmark encoder-decoder", 8)):
        for precision in ("fp32", "bf16"):
            model, batch, cfg = setup(which, precision)
            step = attnlab_step(model, batch, cfg)
            for _ in range(3):
                step()
            eager = median_ms(step, n)
            step = attnlab_step(torch.compile(model), batch, cfg)
            start = time.perf_counter()
            step(), step()
            compile_s = time.perf_counter() - start
            compiled = median_ms(step, n)
            print(f"{which}, {precision}: eager {eager:.1f} ms/step, compiled {compiled:.1f} ms/step "
                  f"(x{eager / compiled:.2f}); compiling took {compile_s:.1f} s")
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
