"""Recurrent encoder-decoders: the Transformer's interface and checks, and what makes Bahdanau
and Luong attention different."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from attnlab import ConfigError
from attnlab.decode.search import beam_search, greedy
from attnlab.runs.config import RunConfig
from attnlab.train.run import train_run

from helpers import assert_cached_matches_uncached, random_ids, sized, tiny_model

KINDS = ["none", "bahdanau", "luong"]


def rnn_model(attention="bahdanau", cell="gru", **kw):
    return tiny_model(arch="rnn", rnn_attention=attention, rnn_cell=cell, score=kw.pop("score", "general"), **kw)


@pytest.mark.parametrize("attention,cell", list(itertools.product(KINDS, ["rnn", "lstm", "gru"])))
def test_cached_equals_uncached_and_padding_is_never_read(attention, cell):
    model = rnn_model(attention, cell)
    src, tgt = random_ids(3, 7, generator_seed=2), random_ids(3, 6, generator_seed=3)
    src[1, 4:] = 0
    assert_cached_matches_uncached(model, tgt, src=src)
    with torch.no_grad():
        torch.testing.assert_close(model(F.pad(src, (0, 3)), tgt), model(src, tgt), atol=1e-5, rtol=0)
        alone = model(src[1:2, :4], tgt[1:2])
        torch.testing.assert_close(alone, model(src, tgt)[1:2], atol=1e-5, rtol=0)  # packed: pads unseen


@pytest.mark.parametrize("attention", KINDS)
def test_beam_one_equals_greedy_and_batch_equals_single(attention):
    model = rnn_model(attention, input_feeding=True)
    src = random_ids(3, 6, generator_seed=4)
    src[2, 3:] = 0
    assert [h[0].tokens for h in beam_search(model, src, beam=1, lenpen=0.0, max_len=8)] == greedy(
        model, src, max_len=8
    )
    beams = beam_search(model, src, beam=3, nbest=2, max_len=8)
    single = beam_search(model, src[2:, :3], beam=3, nbest=2, max_len=8)[0]
    assert [h.tokens for h in single] == [h.tokens for h in beams[2]]
    assert [h.score for h in single] == pytest.approx([h.score for h in beams[2]], abs=1e-4)
    uncached = beam_search(model, src, beam=3, nbest=2, max_len=8, use_cache=False)
    assert [[h.tokens for h in b] for b in uncached] == [[h.tokens for h in b] for b in beams]


@pytest.mark.parametrize(
    "attention,score",
    [("bahdanau", "additive"), ("bahdanau", "general"), ("luong", "general"), ("luong", "location"), ("luong", "dot")],
)
def test_attention_weights_sum_to_one_and_skip_padding(attention, score):
    model = rnn_model(attention, score=score, bidirectional=score != "dot")
    src, tgt = random_ids(2, 6), random_ids(2, 5)
    src[0, 4:] = 0
    model(src, tgt)
    weights = model.decoder.last_attention  # (B, T, S)
    assert weights.shape == (2, 5, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5))
    assert torch.equal(weights[0, :, 4:], torch.zeros(5, 2))


def test_bahdanau_scores_from_the_previous_state_luong_from_the_new_one():
    """The first step's weights come from s_0 in Bahdanau's model, so they cannot depend on the first
    target token; in Luong's they come from s_1, which has read it."""
    src = random_ids(1, 6)
    first = lambda model, y: (model(src, torch.tensor([[y]])), model.decoder.last_attention[0, 0].clone())[1]
    bahdanau, luong = rnn_model("bahdanau"), rnn_model("luong")
    torch.testing.assert_close(first(bahdanau, 5), first(bahdanau, 9))
    assert not torch.allclose(first(luong, 5), first(luong, 9))
    fixed = rnn_model("none")
    fixed(src, torch.tensor([[5]]))
    assert fixed.decoder.last_attention is None


def test_every_parameter_learns():
    model = rnn_model("luong", "lstm", tie_embeddings="none").train()
    src, tgt = random_ids(2, 5), random_ids(2, 4)
    F.cross_entropy(model(src, tgt).flatten(0, 1), random_ids(2, 4, generator_seed=9).flatten()).backward()
    assert not [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]


def test_rnn_config_checks():
    with pytest.raises(ConfigError, match="score 'dot' compares the decoder state"):
        sized(vocab_size=10, d_model=16, arch="rnn", score="dot")
    with pytest.raises(ConfigError, match="model.arch 'encoder_decoder' has no field 'rnn_cell'"):
        sized(vocab_size=10, stack=dict(d_model=16, n_heads=2), rnn_cell="lstm")
    with pytest.raises(ConfigError, match=r"rnn_attention must be one of 'none', 'bahdanau', 'luong'"):
        sized(vocab_size=10, d_model=16, arch="rnn", rnn_attention="monotonic")


def test_attention_rnn_learns_to_reverse(tmp_path):
    cfg = RunConfig.from_sections(
        {
            "model": {
                "arch": "rnn",
                "d_model": 48,
                "n_layers": 1,
                "dropout": 0.0,
                "rnn_attention": "bahdanau",
                "score": "additive",
            },
            "data": {
                "format": "builtin",
                "generator": {"name": "reverse", "min_len": 3, "max_len": 6},
                "text": {"tokenizer": "word"},
                "n_train": 1500,
                "n_valid": 50,
                "n_test": 50,
            },
            "train": {
                "max_steps": 250,
                "max_tokens": 800,
                "lr_schedule": "constant",
                "lr": 0.005,
                "warmup_steps": 10,
                "label_smoothing": 0.0,
                "eval_every": 250,
                "eval_exact_match": 50,
                "progress": False,
                "early_stop_metric": "exact_match",
            },
        }
    )
    summary = train_run(cfg, tmp_path / "run", log=lambda s: None)
    assert summary["last_eval"]["exact_match"] >= 0.8
