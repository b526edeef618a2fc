"""The character language model of configs/shakespeare_char.yaml (4 layers, 4 heads, d_model 128,
block 64, batch 12, AdamW): training tokens/s on random characters, and sampling tokens/s with the
cache at batch 1 and batch 32 (63 new tokens: the model has 64 positions), on one device."""

from __future__ import annotations

from typing import Iterator

import torch

from attnlab.bench.device import device_fields
from attnlab.bench.timing import CPU, interleaved_medians
from attnlab.bench.train import attnlab_step
from attnlab.data.batching import Batch
from attnlab.decode.search import sample
from attnlab.models import build_model, model_config
from attnlab.train.config import TrainConfig

VOCAB = 65  # Tiny Shakespeare's characters
MODEL = dict(arch="decoder_lm", d_model=128, n_heads=4, n_layers=4, d_ff=512, dropout=0.0, activation="gelu",
             norm="pre", positional="learned", max_len=64, tie_embeddings="all")  # the preset's model section
BLOCK, BATCH = 64, 12


def lm_model() -> torch.nn.Module:
    return build_model(model_config({**MODEL, "vocab_size": VOCAB}))


def lm_batch(generator: torch.Generator) -> Batch:
    """BATCH random windows of BLOCK + 1 characters: inputs and next-character targets."""
    window = torch.randint(4, VOCAB, (BATCH, BLOCK + 1), generator=generator)
    return Batch(src=None, tgt_in=window[:, :-1], tgt_out=window[:, 1:])


def lm_train_config(precision: str = "fp32") -> TrainConfig:
    """The preset's optimiser: AdamW (weight decay 0.1, beta2 0.99), here at a constant 1e-3."""
    return TrainConfig(optimizer="adamw", lr_schedule="constant", lr=1e-3, warmup_steps=1, label_smoothing=0.0,
                       weight_decay=0.1, beta2=0.99, precision=precision)


def bench_lm(repeats: int = 10, seed: int = 0, device: torch.device = CPU) -> Iterator[dict]:
    torch.manual_seed(seed)
    model = lm_model().to(device)
    g = torch.Generator().manual_seed(seed)
    batch = lm_batch(g).to(device)
    where = device_fields(device)
    seconds = interleaved_medians({"train": attnlab_step(model, batch, lm_train_config())}, repeats, device=device)
    yield {"name": "lm_train", "value": round(batch.n_tokens / seconds["train"], 1), "unit": "tokens/s",
           "batch": BATCH, "block": BLOCK} | where
    model.eval()
    new = BLOCK - 1
    for b in (1, 32):
        prompt = torch.randint(4, VOCAB, (b, 1), generator=g).to(device)  # (b, 1)
        t = interleaved_medians({"s": lambda: sample(model, prompt=prompt, max_new_tokens=new, stop_at_eos=False,
                                                     generator=torch.Generator().manual_seed(0))},
                                max(1, repeats // 2), device=device)["s"]
        yield {"name": f"lm_sample_b{b}", "value": round(b * new / t, 1), "unit": "tokens/s", "batch": b,
               "new_tokens": new} | where
