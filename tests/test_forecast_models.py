"""The forecasting families: PatchTST (arch patchtst), DLinear (arch dlinear) and the naive last
value (arch last_value). RevIN, patching and the moving average against explicit references,
DLinear's forecast by hand, PatchTST's channel and batch independence, its equivariance under RevIN,
its embedding and parameter count by formula, and the configs' refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import ConfigError, build_model, model_config
from attnlab.analysis.capture import capture_attention
from attnlab.models.shape import DataShape
from attnlab.nn.layers import ResidualConnection, TokenBatchNorm
from attnlab.nn.series import ChannelLinear, LastValue, Patching, RevIN, SeriesDecomposition

from helpers import sized

PAPER = dict(n_channels=7, input_length=336, horizon=96)  # ETTh1, the paper's input and shortest horizon
SMALL = dict(
    n_channels=3,
    input_length=40,
    horizon=12,
    patch_length=8,
    patch_stride=4,
    stack=dict(d_model=16, n_heads=4, n_layers=2, d_ff=32),
)


def series(*shape: int, seed: int = 0) -> torch.Tensor:
    """Random walks with a per-channel offset and scale: (B, L, C)."""
    g = torch.Generator().manual_seed(seed)
    steps = torch.randn(*shape, generator=g).cumsum(1)
    return 3.0 * torch.rand(shape[-1], generator=g) * steps + 10 * torch.randn(shape[-1], generator=g)


def patchtst(seed: int = 0, **fields) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(*sized(arch="patchtst", **{**SMALL, **fields})).eval()


# -- RevIN -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("affine", [False, True])
def test_revin_standardises_each_instance_and_channel_over_time_and_inverts(affine):
    x = series(2, 30, 3)
    revin = RevIN(3, affine=affine)
    gamma, beta = np.ones(3), np.zeros(3)
    if affine:
        with torch.no_grad():
            revin.gamma.copy_(torch.tensor([0.5, 2.0, -1.5]))
            revin.beta.copy_(torch.tensor([0.1, -3.0, 7.0]))
        gamma, beta = revin.gamma.detach().double().numpy(), revin.beta.detach().double().numpy()
    with torch.no_grad():
        normalised, (mean, stdev) = revin.normalise(x)
        back = revin.denormalise(normalised, (mean, stdev))
        y = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(1))  # a forecast in normalised units
        y_denormalised = revin.denormalise(y, (mean, stdev))
    xs = x.double().numpy()
    mean_ref = xs.mean(1, keepdims=True)  # (B, 1, C)
    stdev_ref = np.sqrt(((xs - mean_ref) ** 2).mean(1, keepdims=True) + 1e-5)  # population variance + eps
    np.testing.assert_allclose(mean.numpy(), mean_ref, rtol=1e-5)
    np.testing.assert_allclose(stdev.numpy(), stdev_ref, rtol=1e-5)
    np.testing.assert_allclose(normalised.numpy(), (xs - mean_ref) / stdev_ref * gamma + beta, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(back, x, rtol=1e-5, atol=1e-4)
    by_hand = (y.double().numpy() - beta) / (gamma + 1e-10) * stdev_ref + mean_ref
    np.testing.assert_allclose(y_denormalised.numpy(), by_hand, rtol=1e-5, atol=1e-4)


# -- patching --------------------------------------------------------------------------------------


def test_336_steps_make_42_patches_of_16_every_8_the_last_padded_with_the_last_value():
    x = torch.arange(336.0)
    patches = Patching(16, 8)(x)
    assert patches.shape == (42, 16) and Patching(16, 8).n_patches(336) == 42
    for k in range(41):
        assert torch.equal(patches[k], x[8 * k : 8 * k + 16])
    assert patches[41].tolist() == list(range(328, 336)) + [335] * 8


def test_patching_of_short_series_and_leading_dimensions():
    assert Patching(3, 2)(torch.arange(7.0)).tolist() == [[0, 1, 2], [2, 3, 4], [4, 5, 6], [6, 6, 6]]
    # (L - P) not a multiple of the stride: the padding still reaches the last step
    assert Patching(8, 5)(torch.arange(20.0))[-1].tolist() == [15, 16, 17, 18, 19, 19, 19, 19]
    assert Patching(8, 5).n_patches(20) == 4
    batch = torch.stack([torch.arange(7.0), 100 + torch.arange(7.0)])  # (2, 7)
    assert Patching(3, 3)(batch).tolist() == [
        [[0, 1, 2], [3, 4, 5], [6, 6, 6]],
        [[100, 101, 102], [103, 104, 105], [106, 106, 106]],
    ]


# -- DLinear ---------------------------------------------------------------------------------------


def moving_average_by_loop(x: np.ndarray, k: int) -> np.ndarray:
    """(B, L, C): the mean of x[t - (k-1)/2 ... t + (k-1)/2], steps beyond the ends taken as the end values."""
    L, half = x.shape[1], (k - 1) // 2
    out = np.zeros_like(x)
    for t in range(L):
        for j in range(t - half, t + half + 1):
            out[:, t] += x[:, min(max(j, 0), L - 1)]
    return out / k


@pytest.mark.parametrize("k", [1, 5, 25])
def test_the_trend_is_a_moving_average_with_the_ends_repeated_and_seasonal_is_the_rest(k):
    x = series(2, 30, 3)
    seasonal, trend = SeriesDecomposition(k)(x)
    np.testing.assert_allclose(trend.numpy(), moving_average_by_loop(x.double().numpy(), k), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(seasonal + trend, x)


@pytest.mark.parametrize("individual", [False, True])
def test_dlinear_forecasts_the_two_linear_maps_of_seasonal_and_trend(individual):
    model = build_model(
        *sized(arch="dlinear", n_channels=3, input_length=30, horizon=7, kernel_size=5, individual=individual)
    )
    maps = (model.seasonal, model.trend)
    assert all(torch.all(m.weight == 1 / 30) for m in maps)  # each starts as the mean of the inputs
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in maps:
            m.weight.copy_(torch.randn(m.weight.shape, generator=g))
            m.bias.copy_(torch.randn(m.bias.shape, generator=g))
    x = series(2, 30, 3)
    xs = x.double().numpy()
    trend = moving_average_by_loop(xs, 5)
    seasonal = xs - trend
    W_s, b_s, W_t, b_t = (
        p.detach().double().numpy()
        for p in (model.seasonal.weight, model.seasonal.bias, model.trend.weight, model.trend.bias)
    )
    expected = np.zeros((2, 7, 3))
    for b in range(2):
        for c in range(3):
            ws, bs, wt, bt = (p[c] for p in (W_s, b_s, W_t, b_t)) if individual else (W_s, b_s, W_t, b_t)
            expected[b, :, c] = ws @ seasonal[b, :, c] + bs + wt @ trend[b, :, c] + bt
    np.testing.assert_allclose(model.forecast(x).detach().numpy(), expected, rtol=1e-4, atol=1e-3)
    n_maps = 3 if individual else 1
    assert sum(p.numel() for p in model.parameters()) == 2 * n_maps * (30 * 7 + 7)
    assert isinstance(model.seasonal, ChannelLinear) == individual


# -- the last value ----------------------------------------------------------------------------------


def test_the_last_value_repeated_exactly_with_no_parameters():
    model = build_model(*sized(arch="last_value", **PAPER))
    assert isinstance(model, LastValue) and list(model.parameters()) == []
    x = series(2, 336, 7)
    y = model.forecast(x)
    assert y.shape == (2, 96, 7) and torch.equal(y, x[:, -1:].expand(2, 96, 7))
    y += 1  # a new tensor: the input is untouched
    assert torch.equal(model(x), x[:, -1:].expand(2, 96, 7))


# -- PatchTST --------------------------------------------------------------------------------------


def test_patchtst_channels_are_independent_and_so_are_the_instances_of_a_batch():
    model = patchtst()
    x = series(3, 40, 3)
    y = model.forecast(x)
    changed = x.clone()
    changed[:, :, 1] = series(3, 40, 1, seed=5)[..., 0]
    y_changed = model.forecast(changed)
    torch.testing.assert_close(y_changed[..., [0, 2]], y[..., [0, 2]])  # the other channels: the same numbers
    assert not torch.allclose(y_changed[..., 1], y[..., 1])
    for b in range(3):
        torch.testing.assert_close(model.forecast(x[b : b + 1]), y[b : b + 1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("revin_affine", [False, True])
def test_revin_makes_the_patchtst_forecast_equivariant_to_shift_and_scale_per_channel(revin_affine):
    model = patchtst(revin_affine=revin_affine)
    x = series(2, 40, 3)
    a, b = torch.tensor([0.5, 2.0, 7.0]), torch.tensor([-4.0, 0.0, 30.0])  # per channel, a > 0
    torch.testing.assert_close(model.forecast(a * x + b), a * model.forecast(x) + b, rtol=1e-4, atol=1e-3)
    without = patchtst(revin=False)
    assert not torch.allclose(without.forecast(x + 10), without.forecast(x) + 10, atol=1e-2)


def test_patchtst_embeds_each_patch_linearly_plus_its_position_and_forecasts_from_encode():
    model = patchtst(revin=False)
    assert model.positions.shape == (10, 16) and 0 < model.positions.abs().max() <= 0.02  # U(-0.02, 0.02)
    x = series(2, 40, 3)
    inputs = []
    model.encoder.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
    states = model.encode(x)  # (B C, N, d_model)
    padded = torch.cat([x, x[:, -1:].expand(2, 4, 3)], dim=1)  # (B, 44, C): the last value 4 (the stride) more times
    patches = torch.stack([padded[b, 4 * k : 4 * k + 8, c] for b in range(2) for c in range(3) for k in range(10)])
    W, bias = model.patch_embed.weight, model.patch_embed.bias
    torch.testing.assert_close(inputs[0], patches.view(6, 10, 8) @ W.T + bias + model.positions)  # z_0, series b C + c
    head = model.head.linear
    by_hand = (states.flatten(1) @ head.weight.T + head.bias).view(2, 3, 12).transpose(1, 2)  # (B, H, C)
    torch.testing.assert_close(model.forecast(x), by_hand, rtol=1e-5, atol=1e-5)


def test_patchtst_attention_is_captured_over_the_patches():
    model = patchtst()
    x = series(2, 40, 3)
    y = model.forecast(x)
    with capture_attention(model) as captured:
        torch.testing.assert_close(model.forecast(x), y)
    records = captured.last()
    assert list(records) == ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    for record in records.values():
        assert record.stack == "encoder" and record.probs.shape == (6, 4, 10, 10)
        torch.testing.assert_close(record.probs.sum(-1), torch.ones(6, 4, 10))


def test_token_batch_norm_standardises_each_feature_over_every_token_of_the_batch():
    norm = TokenBatchNorm(4)
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0)) * 3 + 1  # (B, T, d_model)
    flat = x.reshape(15, 4)
    by_hand = (flat - flat.mean(0)) / torch.sqrt(flat.var(0, unbiased=False) + 1e-5)
    torch.testing.assert_close(norm(x), by_hand.view(3, 5, 4))
    torch.testing.assert_close(norm.running_mean, 0.1 * flat.mean(0))  # momentum 0.1, from zeros
    torch.testing.assert_close(norm.running_var, 0.9 + 0.1 * flat.var(0, unbiased=True))  # from ones
    norm.eval()
    torch.testing.assert_close(norm(x), (x - norm.running_mean) / torch.sqrt(norm.running_var + 1e-5))


@pytest.mark.parametrize("normalisation, kind", [("batch", TokenBatchNorm), ("layer", torch.nn.LayerNorm)])
def test_patchtst_normalises_its_residual_blocks_as_chosen(normalisation, kind):
    model = build_model(*sized(arch="patchtst", **PAPER, stack=dict(normalisation=normalisation)))
    norms = [m.norm for m in model.modules() if isinstance(m, ResidualConnection)]
    assert len(norms) == 6 and all(type(norm) is kind for norm in norms)


@pytest.mark.parametrize("revin_affine", [False, True])
def test_patchtst_parameters_of_the_papers_etth1_model(revin_affine):
    cfg, shape = sized(arch="patchtst", **PAPER, revin_affine=revin_affine)
    model = build_model(cfg, shape)
    C, H, P, N, D, F, n_layers = 7, 96, 16, 42, 16, 128, 3
    assert cfg.n_patches(shape) == N
    per_layer = (3 * D * D + 3 * D) + (D * D + D) + (D * F + F + F * D + D) + 2 * 2 * D  # attention, FFN, 2 norms
    expected = (P * D + D) + N * D + n_layers * per_layer + (N * D * H + H) + (2 * C if revin_affine else 0)
    assert sum(p.numel() for p in model.parameters()) == expected == 81_728 + (14 if revin_affine else 0)
    assert model.forecast(series(2, 336, 7)).shape == (2, 96, 7)


# -- configs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["patchtst", "dlinear", "last_value"])
def test_each_family_builds_from_the_datas_sizes_and_round_trips(arch):
    cfg, shape = sized(arch=arch, **PAPER)
    assert shape == DataShape(n_channels=7, input_length=336, horizon=96)
    assert cfg.capabilities.inputs == "series" and not cfg.capabilities.encoder and not cfg.capabilities.decoder
    assert cfg.capabilities.attention_weights == (arch == "patchtst")
    assert not {"n_channels", "input_length", "horizon"} & set(cfg.field_names())  # the data's, not the model's
    assert model_config(cfg.to_dict()) == cfg
    torch.manual_seed(0)
    model = build_model(cfg, shape).eval()
    assert model.forecast(series(2, 336, 7)).shape == (2, 96, 7)
    for name in ("n_channels", "input_length", "horizon"):
        with pytest.raises(ConfigError, match=f"^shape.{name} must be at least 1 \\(got 0\\)$"):
            sized(arch=arch, **{**PAPER, name: 0})
        with pytest.raises(ConfigError, match=f"^model.{name} is set by the data, not the model section"):
            model_config(arch=arch, **{name: PAPER[name]})
    with pytest.raises(ConfigError, match=f"^arch '{arch}' needs horizon from its data, which gives none$"):
        build_model(cfg, DataShape(n_channels=7, input_length=336))


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(arch="patchtst", patch_length=400), r"patch_length \(400\) must be at most input_length \(336\)"),
        (dict(arch="patchtst", patch_stride=0), r"patch_stride must be >= 1"),
        (dict(arch="patchtst", patch_stride=17), r"patch_stride \(17\) must be at most patch_length \(16\)"),
        (dict(arch="patchtst", head_dropout=1.0), r"head_dropout must be in \[0, 1\)"),
        (dict(arch="patchtst", stack=dict(d_model=18)), r"d_model \(18\) must be divisible by n_heads \(4\)"),
        (
            dict(arch="patchtst", stack=dict(attention_backend="local")),
            r"attention_backend 'local' is blockwise or approximate, which a series' few patches \(42 in the paper\) do not need; use 'math' or 'sdpa' or 'auto'$",
        ),
        (dict(arch="patchtst", revin=False, revin_affine=True), r"revin_affine is only used with revin: true"),
        (dict(arch="dlinear", kernel_size=24), r"kernel_size must be odd"),
        (dict(arch="dlinear", kernel_size=0), r"kernel_size must be >= 1"),
        (dict(arch="dlinear", kernel_size=337), r"kernel_size \(337\) must be at most input_length \(336\)"),
        (dict(arch="dlinear", d_model=16), r"model.arch 'dlinear' has no field 'd_model'"),
        (dict(arch="last_value", d_model=16), r"model.arch 'last_value' has no field 'd_model'"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        sized(**PAPER, **fields)
