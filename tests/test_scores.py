"""Alignment score functions against hand computations; weights sum to one and respect padding."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.nn.masks import padding_mask
from attnlab.nn.registry import SCORES
from attnlab.nn.scores import AdditiveScore, CosineScore, DotScore, GeneralScore, LocationScore, ScaledDotScore, attend

Q = torch.tensor([[[1.0, 2.0]]])  # (B=1, Tq=1, 2): the decoder state s_t
K = torch.tensor([[[3.0, 4.0], [1.0, 0.0], [0.0, -1.0]]])  # (1, S=3, 2): encoder states h_i


def test_dot_and_scaled_dot():
    torch.testing.assert_close(DotScore(2, 2)(Q, K), torch.tensor([[[11.0, 1.0, -2.0]]]))
    torch.testing.assert_close(ScaledDotScore(2, 2)(Q, K), torch.tensor([[[11.0, 1.0, -2.0]]]) / math.sqrt(2))


def test_general():
    score = GeneralScore(2, 2)
    with torch.no_grad():
        score.W_a.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))  # W_a h = [h0, 2 h1]
    # s^T W_a h: [1, 2] . [3, 8] = 19; [1, 2] . [1, 0] = 1; [1, 2] . [0, -2] = -4
    torch.testing.assert_close(score(Q, K), torch.tensor([[[19.0, 1.0, -4.0]]]))


def test_additive():
    score = AdditiveScore(2, 2, d_attn=2)
    with torch.no_grad():
        score.W_s.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))  # W_s s = [s0, 0] = [1, 0]
        score.W_h.weight.copy_(torch.tensor([[0.0, 0.0], [0.5, 0.0]]))  # W_h h = [0, h0 / 2]
        score.v_a.weight.copy_(torch.tensor([[2.0, -1.0]]))
    # v^T tanh([1, h0/2]) = 2 tanh(1) - tanh(h0 / 2) for h0 = 3, 1, 0
    expected = [2 * math.tanh(1) - math.tanh(1.5), 2 * math.tanh(1) - math.tanh(0.5), 2 * math.tanh(1)]
    torch.testing.assert_close(score(Q, K), torch.tensor([[expected]]))


def test_cosine_is_the_notes_example():
    """Seed 003: cosine("Hey", "Hey there") with bag-of-words vectors [0, 1] and [1, 1] = 0.71."""
    s = CosineScore(2, 2)(torch.tensor([[[0.0, 1.0]]]), torch.tensor([[[1.0, 1.0], [0.0, 3.0]]]))
    torch.testing.assert_close(s, torch.tensor([[[1 / math.sqrt(2), 1.0]]]))
    assert round(s[0, 0, 0].item(), 2) == 0.71


def test_location_depends_on_the_query_only():
    score = LocationScore(2, 2, max_len=5)
    with torch.no_grad():
        score.W_a.weight.copy_(torch.arange(10.0).view(5, 2))
        score.W_a.bias.zero_()
    # W_a s for s = [1, 2]: rows [0,1],[2,3],[4,5] -> 2, 8, 14 (the first S = 3 positions)
    torch.testing.assert_close(score(Q, K), torch.tensor([[[2.0, 8.0, 14.0]]]))
    torch.testing.assert_close(score(Q, K + 100), score(Q, K))
    with pytest.raises(ValueError, match="cover 5"):
        score(Q, torch.zeros(1, 6, 2))


@pytest.mark.parametrize("name", sorted(SCORES))
def test_weights_sum_to_one_and_respect_padding(name):
    torch.manual_seed(0)
    score = (
        SCORES[name](8, 6, d_attn=5, max_len=10) if name not in ("dot", "scaled_dot", "cosine") else SCORES[name](6, 6)
    )
    d_q = 8 if name in ("general", "additive", "location") else 6
    q, k = torch.randn(2, 4, d_q), torch.randn(2, 7, 6)
    valid = torch.ones(2, 7, dtype=torch.bool)
    valid[1, 5:] = False
    context, weights = attend(score(q, k), k, padding_mask(valid)[:, 0])  # mask (B, 1, S)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4))
    assert torch.equal(weights[1, :, 5:], torch.zeros(4, 2))
    torch.testing.assert_close(context, weights @ k)
    k_changed = k.clone()
    k_changed[1, 5:] = 99.0  # what sits in padding changes nothing
    torch.testing.assert_close(attend(score(q, k_changed), k_changed, padding_mask(valid)[:, 0])[0][1], context[1])
