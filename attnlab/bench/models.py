"""Recurrent vs Transformer encoder-decoders as sequences grow: training and decoding tokens/s.

The notes' argument for the Transformer (seeds 001, 003, 004) is about sequential operations: a
recurrent layer needs O(T) steps one after another where self-attention needs O(1), at the price of
O(T^2) work per layer. This measures what that means on the machine at hand, with the two models of
the Multi30k presets (configs/multi30k_de_en.yaml and configs/rnn_bahdanau.yaml, plus the
fixed-context GRU of configs/rnn_fixed_context.yaml) on random tokens:

- train: target tokens/s of one optimizer step (attnlab's own ``train_step``: teacher forcing,
  label-smoothed loss, Adam) on a batch of ``batch_tokens // T`` pairs of T source and T target
  tokens, so every length costs about the same number of tokens per step;
- decode: generated tokens/s of greedy decoding with the cache, ``decode_batch`` sources of T
  tokens, exactly T new tokens each.

Every figure is the median of ``repeats`` timings after a warm-up, the models taking turns, so that
a change in the machine's speed falls on all of them; each record carries the Transformer's figure
for the same length as its reference and the ratio model / Transformer.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from attnlab.bench.device import device_fields
from attnlab.bench.timing import CPU, checked_length, interleaved_medians, random_pairs
from attnlab.bench.train import attnlab_step, train_config
from attnlab.decode.search import greedy
from attnlab.models import build_model, model_config
from attnlab.models.shape import DataShape
from attnlab.precision import autocast

VOCAB = 8000  # the presets' shared BPE vocabulary
# The model sections of the presets (tests/test_bench.py checks that they agree).
MODELS: dict[str, dict[str, Any]] = {
    "transformer": dict(
        arch="encoder_decoder",
        stack=dict(d_model=256, n_heads=4, n_layers=3, d_ff=1024, dropout=0.1, norm="post"),
        positions=dict(scheme="sinusoidal"),
        embeddings=dict(tie="all"),
    ),
    "gru_bahdanau": dict(
        arch="rnn",
        rnn_cell="gru",
        rnn_attention="bahdanau",
        score="additive",
        bidirectional=True,
        d_model=512,
        n_layers=1,
        dropout=0.3,
        tie_embeddings="all",
    ),
    "gru_fixed_context": dict(
        arch="rnn",
        rnn_cell="gru",
        rnn_attention="none",
        bidirectional=True,
        d_model=512,
        n_layers=1,
        dropout=0.3,
        tie_embeddings="all",
    ),
}
REFERENCE = "transformer"


def build(name: str, max_len: int) -> torch.nn.Module:
    """The preset ``name`` built for sequences of up to ``max_len`` tokens (a Transformer's
    positions.max_len, a recurrent model's max_len, written in its section)."""
    model = MODELS[name]
    limit = {"positions": {**model["positions"], "max_len": max_len}} if "positions" in model else {"max_len": max_len}
    return build_model(model_config({**model, **limit}), DataShape(vocab_size=VOCAB))


def greedy_run(model: torch.nn.Module, src: torch.Tensor, new_tokens: int, precision: str) -> Callable[[], None]:
    """One call = greedy decoding of exactly ``new_tokens`` tokens for each source, with autocast on
    the device the sources are on."""
    amp = autocast(precision, src.device)

    def run() -> None:
        with amp():
            checked_length(greedy(model, src, max_len=new_tokens, min_len=new_tokens), new_tokens)

    return run


def bench_models(
    lengths: tuple[int, ...] = (10, 25, 50, 100, 200, 400),
    models: tuple[str, ...] = tuple(MODELS),
    batch_tokens: int = 4096,
    decode_batch: int = 16,
    precision: str = "fp32",
    repeats: int = 3,
    seed: int = 0,
    device: torch.device = CPU,
) -> Iterator[dict[str, Any]]:
    """Yield one record per (pass, length, model): tokens/s, with the Transformer as reference. At
    each length the models' training steps are timed in turn, then their decodings, on ``device``."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    built = {name: build(name, max_len=max(lengths) + 2).to(device) for name in models}
    for length in lengths:
        batch = random_pairs(max(1, batch_tokens // length), length, VOCAB, generator, device)
        src = random_pairs(decode_batch, length, VOCAB, generator, device).src  # (decode_batch, length + 1)
        assert src is not None  # random pairs have sources
        train = interleaved_medians(
            {name: attnlab_step(model, batch, train_config(precision)) for name, model in built.items()},
            repeats,
            warmup=1,
            device=device,
        )
        for model in built.values():
            model.eval()
        decode = interleaved_medians(
            {name: greedy_run(model, src, length, precision) for name, model in built.items()},
            repeats,
            warmup=1,
            device=device,
        )
        tokens, seconds = (
            {"train": batch.n_targets, "decode": decode_batch * length},
            {"train": train, "decode": decode},
        )
        figures = {(kind, name): tokens[kind] / seconds[kind][name] for name in built for kind in ("train", "decode")}
        for (kind, name), value in figures.items():
            record = {
                "name": kind,
                "model": name,
                "seq_len": length,
                "value": round(value, 1),
                "unit": "tokens/s",
                "batch": batch.tgt_in.shape[0] if kind == "train" else decode_batch,
                "precision": precision,
                **device_fields(device),
            }
            if REFERENCE in models and name != REFERENCE:
                record |= {"reference": REFERENCE, "ratio": round(value / figures[kind, REFERENCE], 3)}
            yield record
