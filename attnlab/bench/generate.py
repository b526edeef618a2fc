"""Greedy generation speed of an imported GPT-2 against Hugging Face ``transformers``' generate on the
same weights: a random GPT2LMHeadModel (no real GPT-2 weights are shipped with attnlab or reachable
offline; the speed depends on the shape only) copied into attnlab's decoder_lm as `attnlab
import-hf` copies it (interop/gpt2.py: the same tensors, the token rows renumbered), ``batch``
prompts of ``prompt_len`` random tokens, ``new_tokens`` tokens each (the end of text ruled out until
then, on both sides: ``min_len`` / ``min_new_tokens``), both with their key-value caches, inference,
fp32. Medians of ``repeats`` calls, interleaved; whether the two produced the same tokens is
reported with them."""

from __future__ import annotations

from typing import Any, Callable, Iterator, cast

import torch

from attnlab.bench.device import device_fields
from attnlab.bench.timing import CPU, interleaved_medians
from attnlab.decode.search import greedy
from attnlab.interop.gpt2 import gpt2_model_fields, gpt2_tensors
from attnlab.models import build_model, model_config
from attnlab.runs.init import copy_tensors, named_tensors

HF = "transformers.GPT2LMHeadModel.generate"
SHAPES = {
    "small": {"n_embd": 768, "n_layer": 12, "n_head": 12},  # GPT-2 small (124M parameters)
    "tiny": {"n_embd": 128, "n_layer": 2, "n_head": 4},
}


def gpt2_pair(
    shape: str, seed: int = 0, device: torch.device = CPU
) -> tuple[torch.nn.Module, torch.nn.Module, list[int | None]]:
    """A random GPT2LMHeadModel of ``shape`` (GPT-2's vocabulary of 50,257 and 1,024 positions),
    attnlab's decoder_lm with its weights, and ``order``: the GPT-2 id of each attnlab id."""
    import transformers

    config: dict[str, Any] = {  # a config.json
        "model_type": "gpt2",
        "vocab_size": 50257,
        "n_positions": 1024,
        "eos_token_id": 50256,
        "bos_token_id": 50256,
    } | SHAPES[shape]
    torch.manual_seed(seed)
    # as the nn.Module it is: transformers leaves its eval unannotated
    hf = cast(torch.nn.Module, transformers.GPT2LMHeadModel(transformers.GPT2Config(**config))).eval()
    eos = config["eos_token_id"]
    order = [None, None, eos, None] + [i for i in range(config["vocab_size"]) if i != eos]
    tensors, _ = gpt2_tensors(hf.state_dict(), config, [eos if old is None else old for old in order], HF)
    fields, sizes = gpt2_model_fields(config, shape)
    ours = build_model(model_config(fields), sizes)
    copy_tensors(named_tensors(ours), tensors, HF)
    return hf.to(device), ours.eval().to(device), order


def bench_generate(
    shape: str = "small",
    batches: tuple[int, ...] = (1, 4),
    prompt_len: int = 16,
    new_tokens: int = 32,
    repeats: int = 3,
    seed: int = 0,
    device: torch.device = CPU,
) -> Iterator[dict[str, Any]]:
    hf, ours, order = gpt2_pair(shape, seed, device)
    to_ours = {old: new for new, old in enumerate(order) if old is not None}
    g = torch.Generator().manual_seed(seed)
    for batch in batches:
        theirs_prompt = torch.randint(0, 50256, (batch, prompt_len), generator=g).to(device)  # (B, P), no end of text
        ours_prompt = torch.tensor([[to_ours[i] for i in row] for row in theirs_prompt.tolist()], device=device)
        results: dict[str, list[list[int]]] = {}

        def theirs() -> None:
            with torch.no_grad():
                out = cast("Callable[..., torch.Tensor]", hf.generate)(  # transformers' generate: ids out
                    input_ids=theirs_prompt,
                    attention_mask=torch.ones_like(theirs_prompt),
                    do_sample=False,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    pad_token_id=50256,
                )
            results["hf"] = out[:, prompt_len:].tolist()

        def mine() -> None:
            with torch.no_grad():
                results["attnlab"] = greedy(ours, prompt=ours_prompt, max_len=new_tokens, min_len=new_tokens)

        seconds = interleaved_medians({"hf": theirs, "attnlab": mine}, repeats, warmup=1, device=device)
        same = [[order[i] for i in row] for row in results["attnlab"]] == results["hf"]
        tokens = batch * new_tokens
        yield {
            "name": f"gpt2_{shape}_greedy_batch{batch}",
            "value": round(tokens / seconds["attnlab"], 1),
            "unit": "tokens/s",
            "reference": HF,
            "reference_value": round(tokens / seconds["hf"], 1),
            "ratio": round(seconds["hf"] / seconds["attnlab"], 3),
            "same_tokens": same,
            "batch": batch,
            "prompt_len": prompt_len,
            "new_tokens": new_tokens,
        } | device_fields(device)
