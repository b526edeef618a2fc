"""The character language model of configs/shakespeare_char.yaml (4 layers, 4 heads, d_model 128,
block 64, batch 12, AdamW): training tokens/s on random characters, and sampling tokens/s with the
cache at batch 1 and batch 32 (63 new tokens: the model has 64 positions), on one device. Each
sampling figure is against CTranslate2's Generator (``with_ct2``, the ``ct2`` extra; bench/ct2.py)
sampling as many tokens from the same prompts, in the same interleaved turns, on the same threads:
transformers' GPT2LMHeadModel of the same shape (random weights, GPT-2's layout: its token
embedding is not scaled by sqrt(d)) converted by CTranslate2's own converter.

With a trained run (:func:`bench_lm_run`), the ways to decode it greedily at batch 1, each against
plain greedy decoding with the cache in the same run: its weights in bf16 or int8, and speculative
decoding with each draft (another run with the same tokenizer, or the run's own multi-token heads),
with the acceptance rate. Random weights would make acceptance meaningless, so this needs runs."""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, cast

import torch

from attnlab.bench.ct2 import engines, numbered, reference_name, threads, unavailable
from attnlab.bench.device import device_fields
from attnlab.bench.reference import TRANSFORMERS_MISSING, transformers_or_none
from attnlab.bench.timing import CPU, checked_length, interleaved_medians
from attnlab.bench.train import attnlab_step
from attnlab.data.batching import Batch
from attnlab.data.tokenizers import BOS, EOS, UNK, Tokenizer
from attnlab.decode.spec import Sample, sample
from attnlab.decode.speculative import OWN_HEADS, SpeculationStats, speculative_decode
from attnlab.decode.weights import weights_of, with_weights
from attnlab.errors import UsageError
from attnlab.models import build_model, model_config
from attnlab.models.shape import DataShape
from attnlab.nn.embeddings import Embeddings
from attnlab.runs.checkpoint import load_draft, load_run
from attnlab.runs.train_config import TrainConfig

VOCAB = 65  # Tiny Shakespeare's characters
MODEL: dict[str, Any] = dict(
    arch="decoder_lm",
    stack=dict(d_model=128, n_heads=4, n_layers=4, d_ff=512, dropout=0.0, activation="gelu", norm="pre"),
    positions=dict(scheme="learned", max_len=64),
    embeddings=dict(tie="all"),
)  # the preset's model section
BLOCK, BATCH = 64, 12


def lm_model() -> torch.nn.Module:
    return build_model(model_config(MODEL), DataShape(vocab_size=VOCAB))


def lm_batch(generator: torch.Generator) -> Batch:
    """BATCH random windows of BLOCK + 1 characters: inputs and next-character targets."""
    window = torch.randint(4, VOCAB, (BATCH, BLOCK + 1), generator=generator)
    return Batch(src=None, tgt_in=window[:, :-1], tgt_out=window[:, 1:])


def lm_train_config(precision: str = "fp32") -> TrainConfig:
    """The preset's optimiser: AdamW (weight decay 0.1, beta2 0.99), here at a constant 1e-3."""
    return TrainConfig(
        optimizer="adamw",
        lr_schedule="constant",
        lr=1e-3,
        warmup_steps=1,
        label_smoothing=0.0,
        weight_decay=0.1,
        beta2=0.99,
        precision=precision,
    )


def lm_gpt2() -> torch.nn.Module | None:
    """transformers' GPT2LMHeadModel of the character LM's shape (random weights), or None without
    ``transformers``: what CTranslate2's Generator converts."""
    if (hf := transformers_or_none()) is None:
        return None
    stack = MODEL["stack"]
    config = hf.GPT2Config(
        vocab_size=VOCAB,
        n_positions=MODEL["positions"]["max_len"],
        n_embd=stack["d_model"],
        n_layer=stack["n_layers"],
        n_head=stack["n_heads"],
        n_inner=stack["d_ff"],
        activation_function=stack["activation"],
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    return hf.GPT2LMHeadModel(config).eval()


def bench_lm(
    repeats: int = 10, seed: int = 0, device: torch.device = CPU, with_ct2: bool = True
) -> Iterator[dict[str, Any]]:
    torch.manual_seed(seed)
    model = lm_model().to(device)
    g = torch.Generator().manual_seed(seed)
    batch = lm_batch(g).to(device)
    where = device_fields(device)
    seconds = interleaved_medians({"train": attnlab_step(model, batch, lm_train_config())}, repeats, device=device)
    yield {
        "name": "lm_train",
        "value": round(batch.n_targets / seconds["train"], 1),
        "unit": "tokens/s",
        "batch": BATCH,
        "block": BLOCK,
    } | where
    model.eval()
    new = BLOCK - 1
    vocabulary = numbered(VOCAB, bos=BOS, eos=EOS, unk=UNK)
    gpt2 = lm_gpt2() if with_ct2 else None
    ct2_missing = unavailable(device) or (TRANSFORMERS_MISSING if gpt2 is None else None)
    generator = (
        engines("Generator", cast(torch.nn.Module, gpt2), vocabulary, ("fp32",))["fp32"]  # not None: ct2_missing
        if with_ct2 and ct2_missing is None
        else None
    )
    label = reference_name("Generator", "fp32")
    for b in (1, 32):
        prompt = torch.randint(4, VOCAB, (b, 1), generator=g).to(device)  # (b, 1)
        runs: dict[str, Callable[[], object]] = {
            "s": lambda: checked_length(sample(model, Sample(max_len=new, stop_at_eos=False), prompt=prompt), new)
        }
        if generator is not None:
            runs["ct2"] = partial(generated, generator, vocabulary.names(prompt.tolist()), new)
        t = interleaved_medians(runs, max(1, repeats // 2), device=device)
        record = {
            "name": f"lm_sample_b{b}",
            "value": round(b * new / t["s"], 1),
            "unit": "tokens/s",
            "batch": b,
            "new_tokens": new,
        }
        if generator is not None:
            record |= {
                "reference": label,
                "reference_value": round(b * new / t["ct2"], 1),
                "ratio": round(t["ct2"] / t["s"], 3),
            } | threads()
        elif with_ct2:
            record |= {"reference": label, "skipped_reference": ct2_missing}
        yield record | where


def generated(generator: Any, prompts: list[list[str]], n: int) -> list[list[int]]:
    """``n`` token ids a prompt sampled by CTranslate2's Generator from the whole distribution
    (top-k = the vocabulary), temperature 1, as attnlab's sampler draws them."""
    results = generator.generate_batch(
        prompts, max_length=n, min_length=n, sampling_topk=VOCAB, include_prompt_in_result=False
    )
    ids = [r.sequences_ids[0] for r in results]
    checked_length(ids, n)
    return ids


def _converted(model: torch.nn.Module, weights: str) -> torch.nn.Module:
    """A copy of ``model`` with ``weights``; one line where it cannot have them (an export of other weights)."""
    try:
        return with_weights(copy.deepcopy(model), weights)
    except ValueError as err:
        raise UsageError(f"--weights {weights}: {err}") from None


def bench_lm_run(
    run: str | Path,
    drafts: tuple[str, ...] = (),
    weights: tuple[str, ...] = (),
    k: int = 4,
    prompt: str = "\n",
    new_tokens: int | None = None,
    repeats: int = 5,
    compiled: bool = False,
    device: torch.device = CPU,
) -> Iterator[dict[str, Any]]:
    """Greedy decoding of a trained language model at batch 1: tokens/s of plain decoding with the
    cache (the reference), of the same with each of ``weights``, with the step compiled
    (``compiled``: kv_cache 'compiled'; the compilation happens in the untimed warm-up), and of
    speculative decoding with
    each of ``drafts`` (a run, or 'heads': the model's own multi-token heads; ``k`` proposals a
    pass, at most one per head), whose text must be plain greedy's. ``new_tokens``: default, all
    the positions after the prompt (speculative decoding does not slide past them). The run is read
    and every check made when this is called; the records time the ways as they are read."""
    model, tokenizers, cfg = load_run(run, "best", device)
    language_model = {"encoder": False, "decoder": True}
    if any(getattr(cfg.capabilities, name) != value for name, value in language_model.items()):
        raise UsageError(f"{run} holds a model of arch '{cfg.arch}', not a language model")
    if OWN_HEADS in drafts and not 1 <= k <= len(cast(torch.nn.ModuleList, model.heads)):  # a DecoderLM's
        raise UsageError(
            f"draft heads: {run} has {len(cast(torch.nn.ModuleList, model.heads))} multi-token heads, "
            f"and k ({k}) must be between 1 and that"
        )
    ids = torch.tensor([cast(Tokenizer, tokenizers["tgt"]).encode(prompt)], device=device)  # (1, P): a LM has "tgt"
    # model.embed: the Embeddings of a DecoderLM or a TransformerXL, the language models
    n = new_tokens or (cast(Embeddings, model.embed).positional.max_positions or ids.shape[1] + 256) - ids.shape[1]

    def plain(m: torch.nn.Module, kv_cache: str = "auto") -> Callable[[], object]:  # the tokens, a run like any
        argmax = Sample(max_len=n, top_k=1, stop_at_eos=False, kv_cache=kv_cache)
        return lambda: sample(m, argmax, prompt=ids)[0]

    expected = plain(model)()
    runs: dict[str, Callable[[], object]] = {"lm_greedy": plain(model)} | {
        f"lm_greedy_{w}": plain(_converted(model, w)) for w in weights
    }
    if compiled:
        runs["lm_greedy_compiled"] = plain(model, "compiled")
    stats: dict[str, SpeculationStats] = {}
    for draft in drafts:
        name = f"lm_speculative_{'heads' if draft == OWN_HEADS else Path(draft).name}"
        drafter = None if draft == OWN_HEADS else load_draft(draft, model, tokenizers, language_model)
        tokens, stats[name] = speculative_decode(model, drafter, prompt=ids, k=k, max_new_tokens=n, stop_at_eos=False)
        if tokens != expected:
            raise RuntimeError(f"{name}: speculative decoding did not give greedy decoding's text")
        runs[name] = (
            lambda d: lambda: speculative_decode(model, d, prompt=ids, k=k, max_new_tokens=n, stop_at_eos=False)
        )(drafter)
    return _timed(runs, stats, n, k, f"lm_greedy ({weights_of(model)} weights, KV cache)", repeats, device)


def _timed(
    runs: dict[str, Callable[[], object]],
    stats: dict[str, SpeculationStats],
    n: int,
    k: int,
    reference: str,
    repeats: int,
    device: torch.device,
) -> Iterator[dict[str, Any]]:
    """:func:`bench_lm_run`'s records, one per way of decoding ``n`` tokens, against 'lm_greedy'."""
    with torch.no_grad():
        seconds = interleaved_medians(runs, repeats, warmup=1, device=device)
    where = device_fields(device)
    for name, t in seconds.items():
        record = {"name": name, "value": round(n / t, 1), "unit": "tokens/s", "batch": 1, "new_tokens": n}
        if name != "lm_greedy":
            record |= {
                "reference": reference,
                "reference_value": round(n / seconds["lm_greedy"], 1),
                "ratio": round(seconds["lm_greedy"] / t, 3),
            }
        if name in stats:
            record |= {
                "k": k,
                "acceptance_rate": round(stats[name].acceptance_rate, 4),
                "tokens_per_pass": round(stats[name].tokens_per_pass, 3),
            }
        yield record | where
