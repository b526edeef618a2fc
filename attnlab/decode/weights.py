"""The weights a trained model decodes with: ``fp32`` as trained, ``bf16`` (every floating tensor
in bfloat16), or ``int8``: dynamic quantisation of the linear layers, PyTorch's own
(``torch.ao.quantization.quantize_dynamic``): each weight matrix stored as int8 with one scale per
output channel, each input quantised on the fly, the products in int8 on the CPU's fbgemm kernels.
Embeddings, norms and the attention arithmetic stay in float32.

Why this tool: torchao (0.18), the library PyTorch points to, has on this CPU no fast int8 kernel:
its weight-only int8 linear ran at fp32's speed and its dynamic int8 one 20 times slower, while
quantize_dynamic ran 2-3 times faster than fp32 (a 512 -> 2048 -> 512 MLP, batch 32, one thread,
measured 2026-11-23 on the 2-core machine of docs/results.md, with other jobs running). PyTorch
marks torch.ao.quantization and its quantized tensors deprecated (torch 2.13 still ships and runs
them); the warnings are silenced here, and the choice is to revisit when torchao gains CPU kernels.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

WEIGHTS = ("fp32", "bf16", "int8")


def with_weights(model: nn.Module, weights: str) -> nn.Module:
    """``model`` (in eval mode) converted in place to ``weights``; int8 only on the CPU."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)} (got {weights!r})")
    if weights == "bf16":
        return model.to(torch.bfloat16)
    if weights == "int8":
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ValueError(f"int8 weights run on the CPU's kernels, and this model is on '{device}'; use bf16 there")
        with warnings.catch_warnings():  # torch.ao.quantization and quantized tensors are marked deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*", category=UserWarning)
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

            return quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
    return model
