"""Encoder forward speed against Hugging Face ``transformers``' BertModel, on one config and the same
weights: a random BERT of all-MiniLM-L6-v2's shape (6 layers, d 384, 12 heads, d_ff 1536,
vocabulary 30,522) copied into attnlab's encoder as `attnlab import-hf` copies it, ``batch``
sequences of ``seq_len`` random tokens, inference (no gradients), fp32 and bf16 (autocast on the
device, for both), both models on one device. attnlab runs with each attention backend asked for;
BertModel with its default attention (PyTorch's scaled_dot_product_attention). Medians of
``repeats`` calls, interleaved; the largest difference of the two outputs is reported with them.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from attnlab.bench.device import device_fields
from attnlab.bench.timing import CPU, interleaved_medians
from attnlab.models import build_model, model_config
from attnlab.interop import bert_model_fields, load_bert
from attnlab.precision import autocast

HF = "transformers.BertModel"
MINILM = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6,
          "num_attention_heads": 12, "intermediate_size": 1536, "max_position_embeddings": 512,
          "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12}


def encoders(backends: tuple[str, ...], seed: int = 0,
             device: torch.device = CPU) -> tuple[torch.nn.Module, dict[str, torch.nn.Module]]:
    """transformers' BertModel with random weights, and attnlab's encoder with those weights for each
    backend, all on ``device`` (the weights are copied on the CPU, then moved)."""
    import transformers

    torch.manual_seed(seed)
    hf = transformers.BertModel(transformers.BertConfig(**MINILM)).eval()
    ours = {}
    for backend in backends:
        fields = bert_model_fields(MINILM, "MiniLM shape")
        model = build_model(model_config(fields, stack=fields["stack"] | {"attention_backend": backend}))
        load_bert(model, hf.state_dict(), list(range(MINILM["vocab_size"])), HF)
        ours[backend] = model.eval().to(device)
    return hf.to(device), ours


def bench_encoder(batch: int = 32, seq_len: int = 128, precisions: tuple[str, ...] = ("fp32", "bf16"),
                  backends: tuple[str, ...] = ("math", "sdpa"), repeats: int = 5, seed: int = 0,
                  device: torch.device = CPU) -> Iterator[dict]:
    hf, ours = encoders(backends, seed, device)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, MINILM["vocab_size"], (batch, seq_len), generator=g).to(device)  # (B, T)
    segments, mask = torch.zeros_like(ids), torch.ones_like(ids)
    tokens = batch * seq_len
    for precision in precisions:
        amp = autocast(precision, device)

        def inference(forward: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
            def call() -> torch.Tensor:
                with torch.no_grad(), amp():
                    return forward()
            return call

        calls = {"hf": inference(lambda: hf(input_ids=ids, token_type_ids=segments, attention_mask=mask).last_hidden_state)}
        calls |= {backend: inference(lambda m=m: m.encode(ids, segments)) for backend, m in ours.items()}
        seconds = interleaved_medians(calls, repeats, warmup=1, device=device)
        reference = calls["hf"]().float()
        for backend in backends:
            difference = (calls[backend]().float() - reference).abs().max().item()
            yield {"name": f"encoder_{precision}_{backend}", "value": round(tokens / seconds[backend], 1),
                   "unit": "tokens/s", "reference": HF, "reference_value": round(tokens / seconds["hf"], 1),
                   "ratio": round(seconds["hf"] / seconds[backend], 3), "max_abs_difference": difference,
                   "batch": batch, "seq_len": seq_len} | device_fields(device)
