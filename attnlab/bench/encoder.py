"""Encoder forward speed against Hugging Face ``transformers``' BertModel, on one config and the same
weights: a random BERT of all-MiniLM-L6-v2's shape (6 layers, d 384, 12 heads, d_ff 1536,
vocabulary 30,522) copied into attnlab's encoder as `attnlab import-hf` copies it, ``batch``
sequences of ``seq_len`` random tokens, inference (no gradients), fp32 and bf16 (autocast on the
device, for both), both models on one device. attnlab runs with each attention backend asked for;
BertModel with its default attention (PyTorch's scaled_dot_product_attention). Medians of
``repeats`` calls, interleaved; the largest difference of the two outputs is reported with them.

ONNX Runtime (``with_ort``, the ``ort`` extra; bench/ort.py) runs the same BertModel, exported for
the same inputs, in fp32 on the CPU, timed in the same interleaved turns: ``encoder_fp32_{backend}_vs_ort``
holds attnlab's fp32 forward against it, with the threads both ran on.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, cast

import torch

from attnlab.bench import ort
from attnlab.bench.device import device_fields
from attnlab.bench.timing import CPU, interleaved_medians
from attnlab.interop import bert_model_fields, load_bert
from attnlab.models import build_model, model_config
from attnlab.nn.encoder_only import EncoderOnly
from attnlab.precision import autocast

HF = "transformers.BertModel"
MINILM: dict[str, Any] = {  # a config.json
    "model_type": "bert",
    "vocab_size": 30522,
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
}


def encoders(
    backends: tuple[str, ...], seed: int = 0, device: torch.device = CPU
) -> tuple[torch.nn.Module, dict[str, torch.nn.Module]]:
    """transformers' BertModel with random weights, and attnlab's encoder with those weights for each
    backend, all on ``device`` (the weights are copied on the CPU, then moved)."""
    import transformers

    torch.manual_seed(seed)
    # as the nn.Module it is: transformers leaves its eval unannotated
    hf = cast(torch.nn.Module, transformers.BertModel(transformers.BertConfig(**MINILM))).eval()
    ours: dict[str, torch.nn.Module] = {}
    for backend in backends:
        fields, shape = bert_model_fields(MINILM, "MiniLM shape")
        model = build_model(model_config(fields, stack=fields["stack"] | {"attention_backend": backend}), shape)
        assert isinstance(model, EncoderOnly)  # bert_model_fields' arch: encoder_only
        load_bert(model, hf.state_dict(), list(range(MINILM["vocab_size"])), HF)
        ours[backend] = model.eval().to(device)
    return hf.to(device), ours


def bench_encoder(
    batch: int = 32,
    seq_len: int = 128,
    precisions: tuple[str, ...] = ("fp32", "bf16"),
    backends: tuple[str, ...] = ("math", "sdpa"),
    repeats: int = 5,
    seed: int = 0,
    device: torch.device = CPU,
    with_ort: bool = True,
) -> Iterator[dict[str, Any]]:
    hf, ours = encoders(backends, seed, device)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, MINILM["vocab_size"], (batch, seq_len), generator=g).to(device)  # (B, T)
    segments = torch.zeros_like(ids)
    inputs = {"input_ids": ids, "token_type_ids": segments, "attention_mask": torch.ones_like(ids)}
    tokens = batch * seq_len
    ort_missing = ort.unavailable(device) if with_ort else None
    for precision in precisions:
        amp = autocast(precision, device)

        def inference(forward: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
            def call() -> torch.Tensor:
                with torch.no_grad(), amp():
                    return forward()

            return call

        calls = {"hf": inference(lambda: hf(**inputs).last_hidden_state)}
        # the default binds each model (mypy cannot type a lambda with one against Callable[[], Tensor])
        calls |= {
            backend: inference(cast("Callable[[], torch.Tensor]", lambda m=m: m.encode(ids, segments)))
            for backend, m in ours.items()
        }
        ort_columns = with_ort and precision == "fp32"  # ONNX Runtime runs the model in its own type
        if ort_columns and ort_missing is None:
            calls["ort"] = ort.last_hidden_state(hf, inputs)
        seconds = interleaved_medians(calls, repeats, warmup=1, device=device)
        outputs = {name: call().float() for name, call in calls.items()}

        def record(name: str, backend: str, reference: str, label: str) -> dict[str, Any]:
            """``backend``'s figure against ``reference``'s (their names in ``calls``), named ``name``."""
            return {
                "name": name,
                "value": round(tokens / seconds[backend], 1),
                "unit": "tokens/s",
                "reference": label,
                "reference_value": round(tokens / seconds[reference], 1),
                "ratio": round(seconds[reference] / seconds[backend], 3),
                "max_abs_difference": (outputs[backend] - outputs[reference]).abs().max().item(),
            }

        shape = {"batch": batch, "seq_len": seq_len} | device_fields(device)
        for backend in backends:
            yield record(f"encoder_{precision}_{backend}", backend, "hf", HF) | shape
        for backend in backends if ort_columns else ():
            name = f"encoder_fp32_{backend}_vs_ort"
            if "ort" in calls:
                yield record(name, backend, "ort", ort.REFERENCE) | ort.threads() | shape
            else:
                yield {
                    "name": name,
                    "unit": "tokens/s",
                    "value": round(tokens / seconds[backend], 1),
                    "reference": ort.REFERENCE,
                    "skipped_reference": ort_missing,
                } | shape
