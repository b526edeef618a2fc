"""Positional encodings: the seeds' table, the rotation property, shift invariance of relative schemes."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab import DataError
from attnlab.nn import SelfAttention, sinusoid
from attnlab.nn.positional import (
    ALiBiPositional,
    LearnedPositional,
    RelativeBias,
    RelativePositional,
    RotaryPositional,
    SinusoidalPositional,
    alibi_slopes,
)
from attnlab.nn.registry import POSITIONAL

from helpers import sized, with_weights


def test_sinusoid_table_of_the_notes():
    """Seed 003: D = 4, n = 100, 'The cat sat on the mat' at positions 0..5."""
    expected = torch.tensor(
        [
            [0.00, 1.00, 0.00, 1.00],
            [0.84, 0.54, 0.10, 1.00],
            [0.91, -0.42, 0.20, 0.98],
            [0.14, -0.99, 0.30, 0.96],
            [-0.76, -0.65, 0.39, 0.92],
            [-0.96, 0.28, 0.48, 0.88],
        ]
    )
    torch.testing.assert_close(sinusoid(torch.arange(6), dim=4, base=100.0), expected, atol=5e-3, rtol=0)


def test_sinusoid_base_sets_the_frequencies():
    pos = torch.arange(50)
    for base in (100.0, 10000.0, 100000.0):
        pe = sinusoid(pos, dim=8, base=base)
        for i in range(4):
            omega = base ** (-2 * i / 8)
            torch.testing.assert_close(pe[:, 2 * i], torch.sin(pos * omega), atol=1e-5, rtol=0)
            torch.testing.assert_close(pe[:, 2 * i + 1], torch.cos(pos * omega), atol=1e-5, rtol=0)


@pytest.mark.parametrize("k", [1, 7, 40])
def test_pe_at_pos_plus_k_is_a_fixed_rotation_of_pe_at_pos(k):
    """Seeds 000/002/004: [PE(pos+k, 2i), PE(pos+k, 2i+1)] = R(k w_i) [PE(pos, 2i), PE(pos, 2i+1)] for
    every pair of dimensions, with the same matrix for every pos."""
    D, pos = 64, torch.arange(0, 200)
    pe, shifted = sinusoid(pos, D).double(), sinusoid(pos + k, D).double()
    omega = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    T_k = torch.zeros(D, D, dtype=torch.float64)
    for i, w in enumerate(omega):
        c, s = math.cos(k * w), math.sin(k * w)
        T_k[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    # the seed's matrix acts on column vectors: PE(pos+k) = T_k PE(pos), i.e. rows: PE(pos) T_k^T
    torch.testing.assert_close(pe @ T_k.T, shifted, atol=1e-4, rtol=0)


def test_absolute_add_and_concat():
    tokens = torch.randn(2, 5, 6)
    pos = torch.arange(5)
    added = SinusoidalPositional(6).embed(tokens, pos)
    torch.testing.assert_close(added, tokens + sinusoid(pos, 6))
    concat = SinusoidalPositional(4, combine="concat").embed(tokens, pos)
    assert concat.shape == (2, 5, 10)
    torch.testing.assert_close(concat[..., :6], tokens)
    torch.testing.assert_close(concat[..., 6:], sinusoid(pos, 4).expand(2, 5, 4))


def test_learned_positions_are_a_table_with_a_limit():
    learned = LearnedPositional(dim=6, max_len=8)
    tokens = torch.zeros(1, 3, 6)
    torch.testing.assert_close(learned.embed(tokens, torch.arange(2, 5)), learned.table.weight[2:5].unsqueeze(0))
    assert learned.max_positions == 8


def test_models_refuse_positions_beyond_the_learned_table():
    from attnlab.models import build_model

    lm = build_model(
        *sized(
            arch="decoder_lm",
            vocab_size=20,
            stack=dict(d_model=16, n_heads=2, n_layers=1, d_ff=32),
            positions=dict(scheme="learned", max_len=8),
        )
    )
    assert lm(torch.ones(1, 8, dtype=torch.long)).shape == (1, 8, 20)
    with pytest.raises(DataError, match=r"position 8 is beyond max_len \(8\)"):
        lm(torch.ones(1, 9, dtype=torch.long))
    cache = lm.new_cache()
    lm(torch.ones(1, 8, dtype=torch.long), cache=cache)
    with pytest.raises(DataError, match=r"position 8 is beyond max_len"):
        lm(torch.ones(1, 1, dtype=torch.long), cache=cache)  # one step after a full cache


def test_alibi_slopes():
    assert alibi_slopes(8).tolist() == [2.0**-i for i in range(1, 9)]
    # 12 heads: the 8-head slopes, then every other slope of the 16-head sequence (Press et al. 2022)
    expected = [2.0**-i for i in range(1, 9)] + [2.0 ** -(i + 0.5) for i in range(0, 4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected))


def test_relative_schemes_clip_offsets():
    torch.manual_seed(0)
    q = torch.randn(1, 2, 1, 4)
    q_pos, k_pos = torch.tensor([0]), torch.tensor([3, 4, 9, -3, -20])
    for scheme in (RelativePositional(d_head=4, max_distance=3), RelativeBias(n_heads=2, max_distance=3)):
        bias = scheme.score_bias(q, q_pos, k_pos)[..., 0, :].expand(1, 2, 5)
        assert torch.equal(bias[..., 0], bias[..., 1]) and torch.equal(bias[..., 1], bias[..., 2])  # j - i >= 3
        assert torch.equal(bias[..., 3], bias[..., 4])  # j - i <= -3
        assert not torch.equal(bias[..., 0], bias[..., 3])


def test_shaw_terms_by_hand():
    """e_ij = q_i . (k_j + a^K_{j-i}) / sqrt(d): the bias is the a^K part; z_i adds sum_j alpha_ij a^V_{j-i}."""
    torch.manual_seed(0)
    rel = RelativePositional(d_head=4, max_distance=2)
    q, probs = torch.randn(1, 1, 2, 4), torch.tensor([[[[0.25, 0.75, 0.0], [0.5, 0.25, 0.25]]]])
    q_pos, k_pos = torch.tensor([0, 1]), torch.tensor([0, 1, 2])
    a_k, a_v = rel.key_table.weight, rel.value_table.weight  # row = offset + 2
    bias = rel.score_bias(q, q_pos, k_pos)
    torch.testing.assert_close(bias[0, 0, 1, 0], q[0, 0, 1] @ a_k[-1 + 2] / 2.0)
    torch.testing.assert_close(bias[0, 0, 0, 2], q[0, 0, 0] @ a_k[2 + 2] / 2.0)
    term = rel.value_term(probs, q_pos, k_pos)
    torch.testing.assert_close(term[0, 0, 1], 0.5 * a_v[1] + 0.25 * a_v[2] + 0.25 * a_v[3])


def test_rotary_rotates_pairs_and_keeps_norms():
    rope = RotaryPositional(d_head=4, base=10000.0)
    x = torch.randn(1, 1, 3, 4)
    pos = torch.tensor([0, 1, 5])
    r = rope.rotate(x, pos)
    torch.testing.assert_close(r[..., 0, :], x[..., 0, :])  # position 0: no rotation
    torch.testing.assert_close(r.norm(dim=-1), x.norm(dim=-1))
    angle = 5 * 10000.0 ** (-2 / 4)  # second pair, position 5
    x2, x3 = x[0, 0, 2, 2], x[0, 0, 2, 3]
    torch.testing.assert_close(
        r[0, 0, 2, 2:],
        torch.stack([x2 * math.cos(angle) - x3 * math.sin(angle), x2 * math.sin(angle) + x3 * math.cos(angle)]),
    )


IN_ATTENTION = [name for name, cls in POSITIONAL.items() if not cls.absolute and name != "none"]


def test_alibi_bias_is_minus_slope_times_distance():
    alibi = ALiBiPositional(n_heads=2)  # slopes 1/16, 1/256
    q_pos, k_pos = torch.tensor([2, 3]), torch.tensor([0, 1, 2, 3, 4])
    bias = alibi.score_bias(torch.zeros(1, 2, 2, 4), q_pos, k_pos)
    distance = torch.tensor([[2.0, 1, 0, 1, 2], [3, 2, 1, 0, 1]])
    torch.testing.assert_close(bias[0, 0], -distance / 16)
    torch.testing.assert_close(bias[0, 1], -distance / 256)


def test_relative_bias_is_a_table_lookup_per_head():
    torch.manual_seed(0)
    rb = RelativeBias(n_heads=3, max_distance=2)
    q_pos, k_pos = torch.arange(4), torch.arange(4)
    bias = rb.score_bias(torch.zeros(1, 3, 4, 4), q_pos, k_pos)
    for h in range(3):
        for i in range(4):
            for j in range(4):
                assert bias[0, h, i, j] == rb.table.weight[max(-2, min(2, j - i)) + 2, h]


def test_rotary_angles_stay_float32_in_a_bfloat16_model():
    rope = RotaryPositional(d_head=64).to(torch.bfloat16)
    x = torch.randn(1, 1, 1, 64)
    pos = torch.tensor([2048])
    exact = RotaryPositional(d_head=64).rotate(x, pos)
    torch.testing.assert_close(rope.rotate(x.bfloat16(), pos).float(), exact, atol=0.05, rtol=0)


@pytest.mark.parametrize("scheme", IN_ATTENTION)
def test_relative_schemes_are_invariant_to_a_shift_of_all_positions(scheme):
    torch.manual_seed(0)
    cfg, _ = sized(
        vocab_size=10,
        stack=dict(d_model=16, n_heads=4),
        positions=dict(scheme=scheme, max_relative_distance=3),
    )
    positional = POSITIONAL[scheme].from_config(cfg)
    mha = SelfAttention(16, 4, positional=positional).eval()
    x = torch.randn(2, 6, 16)
    pos = torch.arange(6)
    out, probs = with_weights(mha, x, positions=(pos, pos))
    for shift in (1, 17, 1000):
        out_s, probs_s = with_weights(mha, x, positions=(pos + shift, pos + shift))
        torch.testing.assert_close(probs_s, probs, atol=1e-5, rtol=0)
        torch.testing.assert_close(out_s, out, atol=1e-5, rtol=0)
    # ... but stretching the distances changes the weights: the positions do matter
    _, probs_stretched = with_weights(mha, x, positions=(2 * pos, 2 * pos))
    assert not torch.allclose(probs_stretched, probs, atol=1e-3)


def test_attention_defaults_positions_to_the_order_of_the_steps():
    torch.manual_seed(0)
    mha = SelfAttention(16, 4, positional=RotaryPositional(4)).eval()
    x = torch.randn(2, 5, 16)
    pos = torch.arange(5)
    torch.testing.assert_close(mha(x), mha(x, positions=(pos, pos)))
