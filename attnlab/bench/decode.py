"""Decoding speed against Hugging Face ``generate``, on models of the same shape (random weights).

Greedy with the KV cache and beam search (5 beams, length penalty 0.6): batch 32 sources of 24
tokens, exactly ``new_tokens`` new tokens each (the minimum and maximum lengths are equal, so both
implementations do the same number of steps). Greedy without the cache recomputes every prefix;
its reference is ``generate(use_cache=False)``. Medians of ``repeats`` runs, interleaved, both
models and the sources on one device. On a GPU, where the searches decode with a static cache and
a CUDA graph of the step (``kv_cache`` 'auto'), greedy with the growable cache is timed too: what
the graph gains. ``weights`` adds greedy and beam search with the model's weights in bf16 or int8
(decode/weights.py), each against Hugging Face's fp32 generate: what fewer bytes of weights gain.
"""

from __future__ import annotations

import copy
from typing import Callable, Iterator

import torch

from attnlab.bench.reference import SHAPE, marian
from attnlab.bench.device import device_fields
from attnlab.bench.timing import CPU, checked_length, interleaved_medians
from attnlab.bench.reference import attnlab_model
from attnlab.data.batching import source_batch
from attnlab.decode.search import beam_search, greedy
from attnlab.decode.weights import with_weights

HF = "transformers.MarianMTModel"


def decode_inputs(batch: int, src_len: int, seed: int,
                  device: torch.device = CPU) -> tuple[torch.nn.Module, torch.Tensor]:
    """The benchmark model (random weights, no dropout, eval mode) and ``batch`` random sources of
    ``src_len`` tokens (EOS included): (B, src_len), both on ``device``."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = attnlab_model(dropout=0.0).eval().to(device)
    ids = torch.randint(4, SHAPE["vocab_size"], (batch, src_len - 1), generator=g).tolist()
    return model, source_batch(ids).to(device)


def bench_decode(batch: int = 32, new_tokens: int = 64, src_len: int = 24, beam: int = 5, repeats: int = 3,
                 with_hf: bool = True, seed: int = 0, device: torch.device = CPU,
                 weights: tuple[str, ...] = ()) -> Iterator[dict]:
    model, src = decode_inputs(batch, src_len, seed, device)
    n = new_tokens
    runs: dict[str, Callable[[], None]] = {"decode_greedy_nocache": lambda: checked_length(
        greedy(model, src, max_len=n, min_len=n, use_cache=False), n)}
    for suffix, variant in [("", model)] + [(f"_{w}", with_weights(copy.deepcopy(model), w)) for w in weights]:
        runs |= searches(variant, src, n, beam, suffix)
    if device.type == "cuda":
        runs["decode_greedy_dynamic"] = lambda: checked_length(greedy(model, src, max_len=n, min_len=n,
                                                                      kv_cache="dynamic"), n)
    hf = marian(0.0) if with_hf else None
    if hf is not None:
        hf = hf.hf.eval().to(device)
        mask = src != 0

        def generate(**kw) -> Callable[[], None]:
            return lambda: hf.generate(input_ids=src, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                       do_sample=False, **kw)

        runs |= {"hf_greedy": generate(num_beams=1), f"hf_beam{beam}": generate(num_beams=beam, length_penalty=0.6),
                 "hf_greedy_nocache": generate(num_beams=1, use_cache=False)}
    with torch.no_grad():
        seconds = interleaved_medians(runs, repeats, warmup=1, device=device)
    where = device_fields(device)
    searched = [("greedy", ""), (f"beam{beam}", ""), ("greedy", "_nocache")]
    searched += [(search, f"_{w}") for w in weights for search in ("greedy", f"beam{beam}")]
    for search, variant in searched:  # each against Hugging Face's fp32 search
        name = f"decode_{search}{variant}"
        record = {"name": name, "value": round(batch * n / seconds[name], 1), "unit": "tokens/s", "batch": batch,
                  "new_tokens": n}
        reference = f"hf_{search}" + ("_nocache" if variant == "_nocache" else "")
        if reference in seconds:
            theirs = batch * n / seconds[reference]
            record |= {"reference": HF + (" (use_cache=False)" if "nocache" in name else ""),
                       "reference_value": round(theirs, 1), "ratio": round(seconds[reference] / seconds[name], 3)}
        elif with_hf:
            record |= {"reference": HF, "skipped_reference": "transformers is not installed (pip install 'attnlab[bench]')"}
        yield record | where
    yield {"name": "decode_cache_speedup", "value": round(seconds["decode_greedy_nocache"] / seconds["decode_greedy"], 2),
           "unit": "x", "reference": "decode_greedy_nocache"} | where
    if "decode_greedy_dynamic" in seconds:
        yield {"name": "decode_graph_speedup", "value": round(seconds["decode_greedy_dynamic"] / seconds["decode_greedy"], 2),
               "unit": "x", "reference": "decode_greedy with kv_cache='dynamic'"} | where


def searches(model: torch.nn.Module, src: torch.Tensor, n: int, beam: int, suffix: str) -> dict[str, Callable[[], None]]:
    """Greedy and beam search of exactly ``n`` new tokens: decode_greedy``suffix``, decode_beam``beam````suffix``."""
    return {f"decode_greedy{suffix}": lambda: checked_length(greedy(model, src, max_len=n, min_len=n), n),
            f"decode_beam{beam}{suffix}": lambda: checked_length(
                [h[0].tokens for h in beam_search(model, src, beam, 0.6, max_len=n, min_len=n)], n)}

