"""The lecture notes' numbers that are wrong, and the saturation of unscaled attention (docs/claims/errors.md and docs/claims/sqrt_dk.md).

Each test computes the correct value with attnlab's own code where attnlab has the piece (the
softmax of the reference backend, the sinusoid table, the FLOP and parameter counts on the meta
device), and checks that the value printed in the notes (../shared/seeds/, file and line in
each docstring) differs from it by more than the notes' rounding.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab.analysis.budget import budget_report
from attnlab.nn import PositionWiseFeedForward, SelfAttention, sinusoid
from attnlab.nn.scores import attend

from helpers import sized

ROOT = Path(__file__).resolve().parents[1]


def softmax(scores: list[float]) -> torch.Tensor:
    """attnlab's softmax (the reference backend's ``attend``), in float64."""
    s = torch.tensor([scores], dtype=torch.float64)
    _, probs = attend(s, torch.eye(len(scores), dtype=torch.float64))
    return probs[0]


def off_by_more_than_rounding(stated: list[float], exact: torch.Tensor, places: int) -> torch.Tensor:
    """Per entry: the printed value is not the exact one rounded to ``places`` decimals."""
    return (torch.tensor(stated, dtype=torch.float64) - exact.double()).abs() > 0.5 * 10**-places + 1e-12


# -- 1. seed 004, line 533: softmax([2.1, 0.3, -0.5, 1.8]) --------------------------------------------


def test_softmax_of_seed_004_scores():
    """Seed 004 line 531-533: softmax([2.1, 0.3, -0.5, 1.8]) printed as [0.58, 0.10, 0.04, 0.28]."""
    probs = softmax([2.1, 0.3, -0.5, 1.8])
    exact = torch.tensor([2.1, 0.3, -0.5, 1.8], dtype=torch.float64).exp()
    assert torch.allclose(probs, exact / exact.sum(), atol=1e-15)
    assert torch.allclose(probs, torch.tensor([0.5050, 0.0835, 0.0375, 0.3741], dtype=torch.float64), atol=5e-5)
    stated = [0.58, 0.10, 0.04, 0.28]
    # the first and last weights are wrong by far more than rounding, 0.10 by a little; 0.04 is right
    assert off_by_more_than_rounding(stated, probs, 2).tolist() == [True, True, False, True]
    assert (torch.tensor(stated, dtype=torch.float64) - probs).tolist() == pytest.approx(
        [0.075, 0.0165, 0.0025, -0.094], abs=5e-4
    )
    # no temperature tau in softmax(s / tau) gives the stated weights, even allowing for their rounding
    # (each within +-0.005): weights 1 and 4 ask for tau = 0.3 / ln(p1 / p4) in [0.397, 0.428], weights
    # 1 and 2 for tau = 1.8 / ln(p1 / p2) in [0.990, 1.059]
    tau_14 = [0.3 / math.log(p1 / p4) for p1, p4 in ((0.585, 0.275), (0.575, 0.285))]
    tau_12 = [1.8 / math.log(p1 / p2) for p1, p2 in ((0.585, 0.095), (0.575, 0.105))]
    assert tau_14 == pytest.approx([0.397, 0.428], abs=1e-3) and tau_12 == pytest.approx([0.990, 1.059], abs=1e-3)
    assert max(tau_14) < min(tau_12)


# -- 2. seed 002, line 274: PE_1 for d_model = 4 -------------------------------------------------------


def test_pe_1_for_d_model_4():
    """Seed 002 line 274: PE_1 = [sin(1/100), cos(1/100), sin(1/10000), cos(1/10000)] ~ [0.01, 1.0, 0.0001, 1.0].

    The note's formula (lines 71-72) is the paper's: base 10000, PE(pos, 2i) = sin(pos / 10000^(2i/d)),
    PE(pos, 2i+1) = cos(...), so for d = 4 the frequencies are 10000^0 = 1 and 10000^(-2/4) = 1/100;
    the note uses 1/100 and 1/10000 (exponents (2i+2)/d)."""
    table = sinusoid(torch.arange(2), 4).double()  # (2, 4): PE_0, PE_1
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0]  # line 273, right
    exact = torch.tensor([math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)], dtype=torch.float64)
    assert torch.allclose(table[1], exact, atol=1e-6)
    assert torch.allclose(table[1], torch.tensor([0.8415, 0.5403, 0.0100, 1.0000], dtype=torch.float64), atol=5e-5)
    stated = [0.01, 1.0, 0.0001, 1.0]
    assert off_by_more_than_rounding(stated[:2], table[1, :2], 2).all()  # 0.01 vs 0.84, 1.0 vs 0.54
    assert off_by_more_than_rounding(stated[2:3], table[1, 2:3], 4).all()  # 0.0001 vs 0.0100
    # the printed vector is the rounding of the note's own expression, frequencies 1/100 and 1/10000
    note = torch.tensor([math.sin(1e-2), math.cos(1e-2), math.sin(1e-4), math.cos(1e-4)], dtype=torch.float64)
    assert torch.allclose(note, torch.tensor(stated, dtype=torch.float64), atol=5e-3)  # the printed rounding of it
    # line 279: x_2 = Embed("猫") + PE_1 inherits the error
    x2 = torch.tensor([0.5, 0.3, -0.2, 0.1], dtype=torch.float64) + table[1]
    assert torch.allclose(x2, torch.tensor([1.3415, 0.8403, -0.1900, 1.1000], dtype=torch.float64), atol=5e-5)
    assert off_by_more_than_rounding([0.51, 1.3], x2[:2], 2).all()


# -- 3. seed 003, line 1119: sin(x + k) = sin x cos k - cos x sin k -----------------------------------


def test_angle_addition_identity_of_seed_003():
    """Seed 003 line 1119 states sin(x + k) = sin(x) cos(k) - cos(x) sin(k); that right side is sin(x - k)."""
    x = torch.linspace(-3.0, 3.0, 61, dtype=torch.float64)[:, None]
    k = torch.tensor([0.3, 1.0, 2.5], dtype=torch.float64)[None, :]
    stated = x.sin() * k.cos() - x.cos() * k.sin()
    correct = x.sin() * k.cos() + x.cos() * k.sin()
    assert torch.allclose(correct, (x + k).sin(), atol=1e-12)
    assert torch.allclose(stated, (x - k).sin(), atol=1e-12)
    assert (stated - (x + k).sin()).abs().max() > 1.6  # the gap is 2 cos(x) sin(k): 1.68 here
    # one point: x = 0.7, k = 0.4; sin(1.1) = 0.8912, the stated right side sin(0.3) = 0.2955
    assert math.sin(0.7 + 0.4) == pytest.approx(0.8912, abs=1e-4)
    assert math.sin(0.7) * math.cos(0.4) - math.cos(0.7) * math.sin(0.4) == pytest.approx(0.2955, abs=1e-4)


@pytest.mark.parametrize("k", [1, 5, 37])
def test_sinusoid_shift_is_a_rotation(k):
    """PE(pos + k) = R(omega_i k) PE(pos) per frequency pair, R = [[cos, sin], [-sin, cos]] (seed 000
    line 291, seed 002 line 83: right): the matrix depends on k and omega_i only, not on pos. The
    matrix the stated identity of seed 003 would give, [[cos, -sin], [sin, cos]], does not fit."""
    d, T = 64, 200
    table = sinusoid(torch.arange(T + k), d).double()  # attnlab's table, float32 values
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    c, s = (omega * k).cos(), (omega * k).sin()
    rotation = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)  # (d/2, 2, 2)
    pairs_at = lambda t: t.view(t.shape[0], d // 2, 2)  # noqa: E731  [sin, cos] per frequency
    now, later = pairs_at(table[:T]), pairs_at(table[k:])
    assert torch.allclose(torch.einsum("fij,pfj->pfi", rotation, now), later, atol=1e-4)
    wrong = rotation.transpose(-1, -2)  # sin(x + k) = sin x cos k - cos x sin k, cos(x + k) = ... + sin x sin k
    assert (torch.einsum("fij,pfj->pfi", wrong, now) - later).abs().max() > 0.5
    # not assuming the form: the one 2 x 2 matrix per frequency that best maps PE(pos) to PE(pos + k)
    # over all 200 positions (least squares, frequencies that turn at least once over them) is R
    seen = omega * T > 2 * math.pi
    fitted = torch.linalg.lstsq(now.transpose(0, 1)[seen], later.transpose(0, 1)[seen]).solution  # (f, 2, 2) = R^T
    assert torch.allclose(fitted.transpose(-1, -2), rotation[seen], atol=1e-5)


# -- 4. seed 004, line 2690: ~700 GFLOPs for one GPT-3 forward pass over 2,048 tokens ------------------

GPT3 = dict(
    arch="decoder_lm",
    vocab_size=50257,
    positions=dict(scheme="learned", max_len=2048),
    embeddings=dict(tie="output"),
    stack=dict(
        d_model=12288, n_heads=96, d_ff=4 * 12288, dropout=0.0, norm="pre", activation="gelu", attention_backend="math"
    ),
)


def test_two_n_rule_on_a_scaled_down_model():
    """Forward FLOPs of a decoder LM = 2 x (weights of its matrix products) x T + 4 L T^2 d (scores and
    weighted sum over the full T x T matrix); 2 N T is within 3 % when T / d = 1/6, as for GPT-3."""
    L, d, T = 4, 768, 128
    stack = {**GPT3["stack"], "d_model": d, "n_heads": 12, "d_ff": 4 * d, "n_layers": L}
    cfg, shape = sized(**{**GPT3, "vocab_size": 8192, "stack": stack, "positions": {**GPT3["positions"], "max_len": T}})
    report = budget_report(cfg, shape, T, 1)
    n, forward = report["params"], report["flops"]["forward"]
    matmul_weights = L * 12 * d * d + 8192 * d  # Q, K, V, O, FFN per layer; the tied output projection
    assert forward == 2 * matmul_weights * T + 4 * L * T * T * d
    assert forward / (2 * n * T) == pytest.approx(1.019, abs=5e-4)  # the 2N rule, within 3 %
    assert forward / (2 * n * T + 2 * L * T * T * d) == pytest.approx(1.007, abs=5e-4)  # Kaplan et al.'s count


def test_gpt3_forward_flops():
    """Seed 004 line 2690: floating_point_ops = 2 * 175e9 * 2048 # ~700 GFLOPs. The expression is
    7.17e14 FLOPs (717 TFLOPs); the label is 1,000 times too small. attnlab's count of its GPT-3
    (96 identical layers: measured with 1 and 2 layers on the meta device, extrapolated linearly)."""
    measured = {}
    for n_layers in (1, 2):
        report = budget_report(*sized(**{**GPT3, "stack": {**GPT3["stack"], "n_layers": n_layers}}), 2048, 1)
        measured[n_layers] = report["params"], report["flops"]["forward"]
    per_layer = [b - a for a, b in zip(measured[1], measured[2])]
    params, forward = (one + 95 * layer for one, layer in zip(measured[1], per_layer))
    assert per_layer[0] == 12 * 12288**2 + 13 * 12288  # Q, K, V, O, FFN matrices, their biases, 2 LayerNorms
    assert params == 174_604_259_328  # GPT-3 "175B"
    T, L, d = 2048, 96, 12288
    formula = T * (2 * params + 2 * L * T * d)  # 2 N per token plus Kaplan et al.'s attention term
    assert formula == 725_074_650_857_472
    assert forward == 734_804_261_732_352  # attnlab forms the whole T x T matrix: 4 L T^2 d, not 2
    assert forward / formula == pytest.approx(1.013, abs=5e-4)
    assert forward / (2 * params * T) == pytest.approx(1.027, abs=5e-4)
    note = 2 * 175e9 * 2048
    assert note == 7.168e14
    assert note / formula == pytest.approx(0.9886, abs=1e-4) and note / forward == pytest.approx(0.9755, abs=1e-4)
    assert 900 < note / 700e9 < 1100 and 900 < forward / 700e9 < 1100  # "~700 GFLOPs" is 1,000 x too small


# -- 5. seed 000, line 538: "FFN uses 5x more computation than attention" (N = 6, d = 512, T = 100) -----


def test_ffn_against_attention_flops_per_layer():
    """Per encoder layer at T = 100, d = 512, d_ff = 2048: projections 4 T d^2 multiply-adds, scores
    and weighted sum 2 T^2 d, FFN 2 T d d_ff; measured by attnlab's budget (2 FLOPs per multiply-add)."""
    N, T, d, d_ff = 6, 100, 512, 2048
    cfg, shape = sized(
        arch="encoder_only",
        vocab_size=100,
        stack=dict(d_model=d, n_heads=8, n_layers=N, d_ff=d_ff, dropout=0.0, attention_backend="math"),
    )
    kinds = budget_report(cfg, shape, T, 1)["flops"]["forward_by_kind"]
    projections, scores, ffn = (kinds[k] // N for k in ("attention_projections", "attention_scores", "feed_forward"))
    assert (projections, scores, ffn) == (2 * 4 * T * d * d, 2 * 2 * T * T * d, 2 * 2 * T * d * d_ff)
    assert (projections, scores, ffn) == (209_715_200, 20_480_000, 419_430_400)
    attention = projections + scores
    assert attention == 230_195_200
    assert ffn / attention == pytest.approx(1.822, abs=1e-3)  # not 5
    assert ffn / scores == pytest.approx(20.48)  # against the T^2 part alone: not 5 either
    assert abs(ffn / attention - 5) > 3 and abs(ffn / scores - 5) > 15
    assert d / T == pytest.approx(5.12)  # the only ratio near 5: T d^2 : T^2 d, the crossover of line 535


# -- 6. seed 000, lines 196-204: the head-count table -------------------------------------------------


@pytest.mark.parametrize("d_model", [512])
def test_attention_parameters_and_flops_do_not_depend_on_head_count(d_model):
    """At fixed d_model the attention sublayer has 4 d^2 + 4 d parameters and the same FLOPs for every
    head count (seed 000 lines 149 and 189 say so, rightly); what Table 3 (A) of the paper varies is
    only how d_model is split, not the size of the model. The BLEU comparison is in docs/claims/heads.md."""
    T, counts, flops = 10, {}, {}
    for h in (1, 2, 4, 8, 16, 32):
        mha = SelfAttention(d_model, h)
        counts[h] = sum(p.numel() for p in mha.parameters())
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            mha(torch.zeros(1, T, d_model))
        flops[h] = counter.get_total_flops()
        assert mha.d_head == d_model // h
    assert set(counts.values()) == {4 * d_model * d_model + 4 * d_model} == {1_050_624}
    assert set(flops.values()) == {2 * 4 * T * d_model**2 + 2 * 2 * T * T * d_model} == {21_176_320}


# -- 7. other worked numbers -------------------------------------------------------------------------


def test_memory_table_of_seed_000():
    """Seed 000 lines 596-608, batch 32, N = 6, h = 8, T = 512, float32, by the note's own formulas:
    attention matrices B N h T^2 x 4 bytes are 1.5 GiB (printed 4.0 GB); activations B N T d x 4 bytes
    are 0.19 GiB (printed 1.2 GB); at T = 2048 the matrices are 24 GiB (printed 64 GB); at T = 4096 one
    matrix is 64 MiB (printed 256 MB, which the note's own table at line 657 gives as 64 MB) and the
    batch's 96 GiB (printed 49 GB)."""
    B, N, h, d, fp32 = 32, 6, 8, 512, 4
    GiB, GB, MiB = 2**30, 1e9, 2**20
    matrices = lambda T: torch.empty(B, N, h, T, T, device="meta").numel() * fp32  # noqa: E731
    assert matrices(512) == 1_610_612_736 and matrices(512) / GiB == 1.5
    assert matrices(512) / GB < 4.0 / 2  # the printed 4.0 GB is 2.5 x the formula
    activations = B * N * 512 * d * fp32
    assert activations == 201_326_592 and activations / GB < 1.2 / 5
    assert matrices(512) / GB + activations / GB + 0.25 + 0.25 + 0.5 == pytest.approx(2.81, abs=0.01)  # not ~6.2
    assert matrices(2048) / GiB == 24.0 and matrices(2048) / GB < 64 / 2
    assert 4096 * 4096 * fp32 / MiB == 64.0  # per matrix, as in the table at line 657, not 256 MB
    assert matrices(4096) / GiB == 96.0 and matrices(4096) / GB > 2 * 49
    assert 8192 * 8192 * fp32 / MiB == 256.0  # the printed 256 MB is the T = 8192 matrix
    # the table at lines 652-658 (one T x T float32 matrix) is right
    assert [T * T * fp32 / MiB for T in (512, 1024, 2048, 4096, 8192)] == [1.0, 4.0, 16.0, 64.0, 256.0]


def test_worked_numbers_that_are_right():
    """What else was checked and found right (docs/claims/errors.md, item 7)."""
    # seed 002 lines 305-309 and 378-379: row softmaxes
    assert softmax([1.2, 0.8]).tolist() == pytest.approx([0.5987, 0.4013], abs=1e-4)  # [0.60, 0.40]
    assert softmax([0.9, 1.5]).tolist() == pytest.approx([0.3543, 0.6457], abs=1e-4)  # [0.35, 0.65]
    assert softmax([0.7, 1.3]).tolist() == pytest.approx([0.3543, 0.6457], abs=1e-4)  # [0.35, 0.65]
    # seed 002 line 334: mean and variance of [0.5, 1.6, 0.9, 2.4]
    x = torch.tensor([0.5, 1.6, 0.9, 2.4], dtype=torch.float64)
    assert x.mean().item() == pytest.approx(1.35) and x.var(unbiased=False).item() == pytest.approx(0.5225)
    # seed 002 lines 538-544: Transformer base parameters (weights only, tied embedding)
    emb, attn, ffn = 37000 * 512, 4 * 512**2, 2 * 512 * 2048
    assert (attn, ffn) == (1_048_576, 2_097_152)
    assert 6 * (attn + ffn) == 18_874_368 and 6 * (2 * attn + ffn) == 25_165_824
    assert (emb + 6 * (attn + ffn) + 6 * (2 * attn + ffn)) / 1e6 == pytest.approx(63.0, abs=0.1)
    # seed 000 line 360: FFN parameters per layer with biases, "~2.1M"
    assert sum(p.numel() for p in PositionWiseFeedForward(512, 2048, torch.nn.ReLU()).parameters()) == 2_099_712
    # seed 000 line 546: 2^(5N) paths for N = 6; line 562: log(100)
    assert 2 ** (5 * 6) == 1_073_741_824 and math.log(100) == pytest.approx(4.605, abs=1e-3)
    # seed 004 line 2681: GPT-3 training compute 6 N D
    assert 6 * 175e9 * 300e9 == pytest.approx(3.15e23)
    # seed 004 line 2702: seq_len squared
    assert [n * n for n in (128, 256, 512, 1024, 2048, 4096)] == [16384, 65536, 262144, 1048576, 4194304, 16777216]
    # seed 003 line 230: cosine similarity of [0, 1] and [1, 1]
    assert torch.nn.functional.cosine_similarity(
        torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0]), dim=0
    ).item() == pytest.approx(0.7071, abs=1e-4)
    # seed 004 lines 654-681: the "cat" query; weights right to their rounding (the output's rounding
    # is in docs/architecture.md, "Where the lecture notes' numbers are rounded or mislabelled")
    scores = [0.30, 0.96, 0.10, 0.00, 0.30, 0.20]
    weights = softmax([s / 2.0 for s in scores])
    assert not off_by_more_than_rounding([0.16, 0.23, 0.15, 0.14, 0.16, 0.16], weights, 2).any()
    assert sum(math.exp(s / 2.0) for s in scores) == pytest.approx(7.10, abs=5e-3)


# -- Dividing scores by sqrt(d_k) -----------------------------------------------------------------------


def experiment(name: str):
    """docs/experiments/NAME.py, imported as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / f"docs/experiments/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_unscaled_scores_saturate_the_softmax():
    """d_k = 1024, 8 x 64 query rows over 64 keys, seed 0: without the division the scores' variance is
    ~d_k, the rows are nearly one-hot and a typical row's gradient is tiny; with it, none of that."""
    m = experiment("scale_saturation").measure(1024, batch=8, seed=0)
    scaled, unscaled = m["scaled"], m["unscaled"]
    assert unscaled["var"] == pytest.approx(1024, rel=0.1) and scaled["var"] == pytest.approx(1.0, rel=0.1)
    assert unscaled["max_p"] > 0.9 and scaled["max_p"] < 0.2
    assert unscaled["entropy"] < 0.3 and scaled["entropy"] > 3.5  # uniform: log 64 = 4.16
    assert unscaled["grad_median"] < scaled["grad_median"] / 10
    assert unscaled["grad"] < scaled["grad"]  # the mean: rows with two near-equal top scores keep gradients


# -- SCAN: the kinds of error docs/claims/scan_lake_baroni.md counts ----------------------------------------------------


def test_scan_errors_tell_a_repeated_unit_too_many_or_too_few_from_other_errors():
    """Worked by hand: "run around left twice" is (L RUN) x 8; one unit more at the end is late and one
    unit off; one unit fewer is early and one unit off; a changed action is neither; six turns read as
    four is one unit off inside the output; a right output is no error."""
    errors = experiment("scan_errors")
    unit = ["I_TURN_LEFT", "I_RUN"]
    ref = unit * 8
    turns = ["I_TURN_LEFT"] * 6 + ["I_WALK"]
    pairs = [(ref, ref + unit), (ref, ref[:-2]), (ref, ref[:-1] + ["I_WALK"]), (turns, turns[2:]), (ref, ref)]
    assert [errors.one_unit_off(r, h) for r, h in pairs] == [True, True, False, True, False]
    assert errors.error_kinds(pairs) == {
        "commands": 5,
        "errors": 4,
        "late": 1,
        "early": 1,
        "one unit too many or too few": 3,
        "long (>= 24 actions)": 0,
    }
    assert errors.error_kinds([(ref * 2, ref * 2 + unit)])["long (>= 24 actions)"] == 1
