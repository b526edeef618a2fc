"""The ablation switches of the attention stack (``stack``: no normalisation, no residual sums, no FFN,
the attention scale), each against its explicit formula, refused where it cannot apply, and cached
decoding equal to uncached under each."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab import ConfigError
from attnlab.nn import ResidualConnection, SelfAttention
from attnlab.nn.layers import EncoderLayer, NoNorm, NoResidual
from attnlab.nn.masks import AttentionMask
from attnlab.nn.registry import ATTENTION_BACKENDS
from attnlab.nn.scores import LearnedScale, NoScale

from helpers import assert_cached_matches_uncached, random_ids, sized, tiny_model

D, H = 16, 4


def by_hand(mha: SelfAttention, x: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale q k^T) v per head, through the module's own projections, by hand."""
    B, T, _ = x.shape
    q, k, v = mha.qkv_proj(x).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)  # (B, H, T, Dh) each
    probs = torch.softmax(scale * q @ k.transpose(-1, -2), dim=-1)
    return mha.out_proj((probs @ v).transpose(1, 2).reshape(B, T, D))


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("scale, factor", [(None, 1 / math.sqrt(D // H)), ("none", 1.0), ("learned", 0.7)])
def test_the_attention_scale_multiplies_q_dot_k(backend, scale, factor):
    torch.manual_seed(0)
    chosen = {None: None, "none": NoScale(D // H), "learned": LearnedScale(D // H)}[scale]
    mha = SelfAttention(D, H, backend=ATTENTION_BACKENDS[backend](), scale=chosen).eval()
    if scale == "learned":
        assert mha.scale.scale.item() == pytest.approx(1 / math.sqrt(D // H))  # starts at the paper's
        mha.scale.scale.data.fill_(factor)
    x = torch.randn(2, 5, D)
    torch.testing.assert_close(mha(x), by_hand(mha, x, factor), rtol=1e-5, atol=1e-5)


def test_the_learned_scale_gets_the_gradient_of_the_loss():
    """d loss / d scale by autograd equals a central finite difference of the loss (float64, where
    the difference's rounding is far below the tolerance)."""
    torch.manual_seed(0)
    mha = SelfAttention(D, H, scale=LearnedScale(D // H)).double().eval()
    x = torch.randn(2, 5, D, dtype=torch.float64)

    def loss() -> torch.Tensor:
        return mha(x).square().sum()

    loss().backward()
    scale, eps = mha.scale.scale.item(), 1e-6
    with torch.no_grad():
        mha.scale.scale.fill_(scale + eps)
        above = loss().item()
        mha.scale.scale.fill_(scale - eps)
        below = loss().item()
    difference = (above - below) / (2 * eps)
    assert abs(difference) > 0.1  # a gradient that matters, not two zeros agreeing
    assert mha.scale.scale.grad.item() == pytest.approx(difference, rel=1e-6)


def test_without_normalisation_a_residual_block_is_the_sum():
    block = ResidualConnection(D, 0.0, "post", normalisation=NoNorm)
    x, f = torch.randn(2, 3, D), torch.nn.Linear(D, D)
    torch.testing.assert_close(block(x, f), x + f(x))
    assert not list(block.parameters())


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_without_the_residual_sum_the_sublayer_replaces_its_input(placement):
    block = NoResidual(D, 0.0, placement)
    with torch.no_grad():
        block.norm.weight.uniform_(0.5, 1.5), block.norm.bias.uniform_(-0.5, 0.5)
    x, f = torch.randn(2, 3, D), torch.nn.Linear(D, D)
    expected = block.norm(f(x)) if placement == "post" else f(block.norm(x))
    torch.testing.assert_close(block(x, f), expected)


def test_a_layer_without_ffn_stops_after_attention():
    torch.manual_seed(0)
    mha, res = SelfAttention(D, H).eval(), ResidualConnection(D, 0.0, "post")
    layer = EncoderLayer(mha, None, res, None).eval()
    x = torch.randn(2, 5, D)
    valid = torch.ones(2, 5, dtype=torch.bool)
    out = layer(x, AttentionMask(key_valid=valid), (torch.arange(5), torch.arange(5)))
    torch.testing.assert_close(out, res.norm(x + mha(x)))


@pytest.mark.parametrize(
    "fields, counted",
    [
        ({"ffn": False}, lambda d, f, n: -n * (2 * d * f + f + d + 2 * d)),  # each layer's FFN and its norm
        ({"normalisation": "none"}, lambda d, f, n: -n * 2 * 2 * d),  # every norm's gain and bias
        ({"residual": False}, lambda d, f, n: 0),
        ({"attention_scale": "learned"}, lambda d, f, n: n),  # one scalar per attention module
    ],
)
def test_the_switches_change_exactly_the_parameters_they_name(fields, counted):
    base = sum(p.numel() for p in tiny_model(arch="decoder_lm").parameters())
    model = tiny_model(arch="decoder_lm", **fields)
    assert sum(p.numel() for p in model.parameters()) == base + counted(16, 32, 2)


@pytest.mark.parametrize(
    "fields",
    [
        {"ffn": False},
        {"residual": False},
        {"normalisation": "none"},
        {"attention_scale": "none"},
        {"attention_scale": "learned"},
        {"positions": {"scheme": "none"}},
    ],
)
@pytest.mark.parametrize("arch", ["decoder_lm", "encoder_decoder"])
def test_cached_decoding_equals_uncached_under_each_switch(arch, fields):
    model = tiny_model(arch=arch, **{"positions": {"scheme": "rotary"}, "norm": "pre", **fields})
    tgt = random_ids(2, 7)
    assert_cached_matches_uncached(model, tgt, src=random_ids(2, 5, generator_seed=1) if arch != "decoder_lm" else None)


def test_the_paper_is_the_default_and_switches_are_refused_where_they_cannot_apply():
    cfg, _ = sized(arch="decoder_lm", vocab_size=10)
    stack = cfg.stack
    assert (stack.normalisation, stack.residual, stack.ffn, stack.attention_scale) == ("layer", True, True, "sqrt_dk")
    with pytest.raises(ConfigError, match="normalisation 'batch' standardises each feature over every token"):
        sized(arch="decoder_lm", vocab_size=10, stack=dict(normalisation="batch"))
    with pytest.raises(ConfigError, match="attention_backend 'linear' never forms scores, so attention_scale"):
        sized(
            arch="decoder_lm",
            vocab_size=10,
            stack=dict(attention_backend="linear", attention_dropout=0.0, attention_scale="none"),
        )
    with pytest.raises(ConfigError, match="attention_scale must be one of 'sqrt_dk', 'none', 'learned'"):
        sized(arch="decoder_lm", vocab_size=10, stack=dict(attention_scale="sqrt"))
    with pytest.raises(ConfigError, match="has no field 'ffn'"):
        sized(arch="rnn", vocab_size=10, ffn=False)
    with pytest.raises(
        ConfigError,
        match=r"^model.ffn is a field of model.stack: write it inside stack \(stack: "
        r"\{ffn: ...\}; --set model.stack.ffn=...\)$",
    ):
        sized(arch="decoder_lm", vocab_size=10, ffn=False)
