"""Decoding weights (decode/weights.py): int8 linear layers hold each output channel as int8 with
the symmetric per-channel scale max|w| / 127.5 and compute what the float layer computes within
that rounding; bf16 converts every floating tensor; the searches run on both and their
log-probabilities stay close to fp32's; int8 is refused off the CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from attnlab.decode.search import DecodingSession, greedy
from attnlab.decode.weights import with_weights
from helpers import random_ids, tiny_model


def quantized_linears(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__ == "Linear" and hasattr(m, "_packed_params")]


def test_int8_weights_are_per_channel_symmetric_int8_of_every_linear_layer():
    model = tiny_model(arch="encoder_decoder")
    floats = {name: m.weight.detach().clone() for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    quantized = with_weights(copy.deepcopy(model), "int8")
    linears = dict((name, m) for name, m in quantized.named_modules() if m in quantized_linears(quantized))
    assert set(linears) == set(floats) and len(linears) > 10
    for name, module in linears.items():
        w = module.weight()  # the int8 tensor with its scales
        assert w.dtype == torch.qint8 and w.qscheme() == torch.per_channel_affine
        assert (w.q_per_channel_zero_points() == 0).all()  # symmetric: stored as affine about 0
        amax = floats[name].abs().amax(dim=1)  # (out,) one scale per output channel
        torch.testing.assert_close(w.q_per_channel_scales().float(), amax / 127.5, rtol=1e-5, atol=1e-12)
        error = (w.dequantize() - floats[name]).abs()
        assert (error <= w.q_per_channel_scales().float()[:, None] / 2 + 1e-7).all()


# measured on this model: int8 max 0.093, mean 0.020; bf16 max 0.029, mean 0.006 (nats)
@pytest.mark.parametrize("weights, largest, mean", [("int8", 0.15, 0.03), ("bf16", 0.05, 0.01)])
def test_decoding_with_lower_precision_weights_stays_close_to_fp32(weights, largest, mean):
    model = tiny_model(arch="encoder_decoder")
    lower = with_weights(copy.deepcopy(model), weights)
    src, tgt = random_ids(4, 9), random_ids(4, 6, generator_seed=1)
    exact = DecodingSession(model, src=src, kv_cache="dynamic").score(tgt)
    close = DecodingSession(lower, src=src, kv_cache="dynamic").score(tgt)
    finite = exact.isfinite()
    assert close.dtype == torch.float32 and (close.isfinite() == finite).all()
    difference = (close[finite] - exact[finite]).abs()
    assert difference.max() < largest and difference.mean() < mean
    assert len(greedy(lower, src)) == 4
    if weights == "bf16":
        assert {p.dtype for p in lower.parameters()} == {torch.bfloat16}


def test_int8_is_refused_off_the_cpu_and_unknown_weights_too():
    model = tiny_model(arch="decoder_lm").to("meta")
    with pytest.raises(ValueError, match="int8 weights run on the CPU's kernels, and this model is on 'meta'"):
        with_weights(model, "int8")
    with pytest.raises(ValueError, match="weights must be one of fp32, bf16, int8"):
        with_weights(model, "fp16")
