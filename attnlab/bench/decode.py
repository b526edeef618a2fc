"""Decoding speed against Hugging Face ``generate``, on models of the same shape (random weights).

Greedy with the KV cache and beam search (5 beams, length penalty 0.6): batch 32 sources of 24
tokens, exactly ``new_tokens`` new tokens each (the minimum and maximum lengths are equal, so both
implementations do the same number of steps). Greedy without the cache recomputes every prefix;
its reference is ``generate(use_cache=False)``. Medians of ``repeats`` runs, interleaved, both
models and the sources on one device. On a GPU, where the searches decode with a static cache and
a CUDA graph of the step (``kv_cache`` 'auto'), greedy with the growable cache is timed too: what
the graph gains. ``weights`` adds greedy and beam search with the model's weights in bf16 or int8
(decode/weights.py), each against Hugging Face's fp32 generate: what fewer bytes of weights gain.

CTranslate2 (``with_ct2``, the ``ct2`` extra; bench/ct2.py) runs the same searches on the same
weights, Hugging Face's MarianMTModel converted by its own converter, in fp32 and, where ``weights``
has it, int8: each attnlab search against CTranslate2's at the same compute type
(``decode_greedy_int8_vs_ct2``: attnlab's int8 greedy against CTranslate2's int8 greedy), timed in
the same interleaved turns, on the same thread count. Every CTranslate2 row must have the fixed
number of tokens too.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any, Callable, Iterator, cast

import torch

from attnlab.bench.ct2 import COMPUTE_TYPES, engines, numbered, reference_name, threads, unavailable
from attnlab.bench.device import device_fields
from attnlab.bench.reference import SHAPE, TRANSFORMERS_MISSING, attnlab_model, marian
from attnlab.bench.timing import CPU, checked_length, interleaved_medians
from attnlab.data.batching import source_batch
from attnlab.data.tokenizers import EOS, PAD, UNK
from attnlab.decode.search import beam_search, greedy
from attnlab.decode.weights import with_weights

HF = "transformers.MarianMTModel"


def decode_inputs(
    batch: int, src_len: int, seed: int, device: torch.device = CPU
) -> tuple[torch.nn.Module, torch.Tensor]:
    """The benchmark model (random weights, no dropout, eval mode) and ``batch`` random sources of
    ``src_len`` tokens (EOS included): (B, src_len), both on ``device``."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = attnlab_model(dropout=0.0).eval().to(device)
    ids = torch.randint(4, SHAPE["vocab_size"], (batch, src_len - 1), generator=g).tolist()
    return model, source_batch(ids).to(device)


def bench_decode(
    batch: int = 32,
    new_tokens: int = 64,
    src_len: int = 24,
    beam: int = 5,
    repeats: int = 3,
    with_hf: bool = True,
    seed: int = 0,
    device: torch.device = CPU,
    weights: tuple[str, ...] = (),
    with_ct2: bool = True,
) -> Iterator[dict[str, Any]]:
    model, src = decode_inputs(batch, src_len, seed, device)
    n = new_tokens
    variant: torch.nn.Module | str  # a searched model, then the suffix of a search's records
    runs: dict[str, Callable[[], object]] = {
        "decode_greedy_nocache": lambda: checked_length(greedy(model, src, max_len=n, min_len=n, use_cache=False), n)
    }
    for suffix, variant in [("", model)] + [(f"_{w}", with_weights(copy.deepcopy(model), w)) for w in weights]:
        runs |= searches(variant, src, n, beam, suffix)
    if device.type == "cuda":
        runs["decode_greedy_dynamic"] = lambda: checked_length(
            greedy(model, src, max_len=n, min_len=n, kv_cache="dynamic"), n
        )
    hf: torch.nn.Module | None  # the MarianWrapper, then its MarianMTModel
    hf = marian(0.0) if with_hf or with_ct2 else None  # generate's model, and CTranslate2's weights
    if hf is not None:
        hf = hf.hf.eval().to(device)
    if hf is not None and with_hf:
        mask = src != 0

        def generate(**kw: Any) -> Callable[[], torch.Tensor]:
            return lambda: cast("Callable[..., torch.Tensor]", hf.generate)(  # transformers' generate: ids out
                input_ids=src, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw
            )

        runs |= {
            "hf_greedy": generate(num_beams=1),
            f"hf_beam{beam}": generate(num_beams=beam, length_penalty=0.6),
            "hf_greedy_nocache": generate(num_beams=1, use_cache=False),
        }
    ct2_weights = ("fp32", *(w for w in weights if w in COMPUTE_TYPES))
    ct2_missing = unavailable(device) or (TRANSFORMERS_MISSING if hf is None else None)
    if with_ct2 and ct2_missing is None:
        assert hf is not None  # ct2_missing says why otherwise
        runs |= translations(hf, src, n, beam, ct2_weights)
    with torch.no_grad():
        seconds = interleaved_medians(runs, repeats, warmup=1, device=device)
    where = device_fields(device)

    def record(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "value": round(batch * n / seconds[name], 1),
            "unit": "tokens/s",
            "batch": batch,
            "new_tokens": n,
        }

    def against(reference: str, key: str, name: str) -> dict[str, Any]:
        return {
            "reference": reference,
            "reference_value": round(batch * n / seconds[key], 1),
            "ratio": round(seconds[key] / seconds[name], 3),
        }

    searched = [("greedy", ""), (f"beam{beam}", ""), ("greedy", "_nocache")]
    searched += [(search, f"_{w}") for w in weights for search in ("greedy", f"beam{beam}")]
    for search, variant in searched:  # each against Hugging Face's fp32 search
        name = f"decode_{search}{variant}"
        reference = f"hf_{search}" + ("_nocache" if variant == "_nocache" else "")
        label = HF + (" (use_cache=False)" if variant == "_nocache" else "")
        if reference in seconds:
            yield record(name) | against(label, reference, name) | where
        else:
            skipped = {"reference": HF, "skipped_reference": TRANSFORMERS_MISSING} if with_hf else {}
            yield record(name) | skipped | where
    for w in ct2_weights if with_ct2 else ():  # each against CTranslate2's search at the same compute type
        label = reference_name("Translator", w)
        for search in (f"greedy{weights_suffix(w)}", f"beam{beam}{weights_suffix(w)}"):
            name, key = f"decode_{search}", f"ct2_{search}"
            compared = (
                against(label, key, name) if key in seconds else {"reference": label, "skipped_reference": ct2_missing}
            )
            yield record(name) | {"name": f"{name}_vs_ct2"} | compared | threads() | where
    yield {
        "name": "decode_cache_speedup",
        "value": round(seconds["decode_greedy_nocache"] / seconds["decode_greedy"], 2),
        "unit": "x",
        "reference": "decode_greedy_nocache",
    } | where
    if "decode_greedy_dynamic" in seconds:
        yield {
            "name": "decode_graph_speedup",
            "value": round(seconds["decode_greedy_dynamic"] / seconds["decode_greedy"], 2),
            "unit": "x",
            "reference": "decode_greedy with kv_cache='dynamic'",
        } | where


def weights_suffix(weights: str) -> str:
    """The records' suffix for a search with ``weights``: none for fp32, '_int8' for int8."""
    return "" if weights == "fp32" else f"_{weights}"


def translations(
    hf: torch.nn.Module, src: torch.Tensor, n: int, beam: int, weights: tuple[str, ...]
) -> dict[str, Callable[[], list[list[str]]]]:
    """CTranslate2's greedy and beam search of exactly ``n`` new tokens on ``hf``'s weights, with
    each of ``weights``: ct2_greedy``suffix``, ct2_beam``beam````suffix``. The vocabulary ends with
    the ``<pad>`` its Marian loader drops (Marian's layout; bench/ct2.py)."""
    vocabulary = numbered(SHAPE["vocab_size"], eos=EOS, unk=UNK, pad=SHAPE["vocab_size"] - 1)
    sources = vocabulary.names(src.tolist(), leave_out=PAD)  # the same sources, EOS included
    runs: dict[str, Callable[[], list[list[str]]]] = {}
    for w, translator in engines("Translator", hf, vocabulary, weights).items():
        runs |= {
            f"ct2_greedy{weights_suffix(w)}": partial(translated, translator, sources, n, 1),
            f"ct2_beam{beam}{weights_suffix(w)}": partial(translated, translator, sources, n, beam),
        }
    return runs


def translated(translator: Any, sources: list[list[str]], n: int, beam: int) -> list[list[str]]:
    """One batch translated by CTranslate2: the best hypothesis of each row, ``n`` tokens (its
    minimum and maximum decoding lengths), with the length penalty of the beam searches here."""
    results = translator.translate_batch(
        sources, beam_size=beam, length_penalty=0.6, max_decoding_length=n, min_decoding_length=n
    )
    best = [r.hypotheses[0] for r in results]
    checked_length(best, n)
    return best


def searches(
    model: torch.nn.Module, src: torch.Tensor, n: int, beam: int, suffix: str
) -> dict[str, Callable[[], None]]:
    """Greedy and beam search of exactly ``n`` new tokens: decode_greedy``suffix``, decode_beam``beam````suffix``."""
    return {
        f"decode_greedy{suffix}": lambda: checked_length(greedy(model, src, max_len=n, min_len=n), n),
        f"decode_beam{beam}{suffix}": lambda: checked_length(
            [h[0].tokens for h in beam_search(model, src, beam, 0.6, max_len=n, min_len=n)], n
        ),
    }
