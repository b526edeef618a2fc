"""The convolutional encoder-decoder (nn/convs2s.py, models/convs2s.py) and the NAG optimizer it trains
with. The reference: fairseq 0.6.0's fconv forward (fairseq/models/fconv.py) restated below in its own
layout (time x batch x channels, torch.conv_tbc, the decoder's convolution padded by k - 1 and trimmed),
on the model's weights."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.decode.search import beam_search, greedy
from attnlab.errors import ConfigError
from attnlab.models import build_model
from attnlab.runs.config import RunConfig
from attnlab.runs.train_config import TrainConfig
from attnlab.train.run import train_run
from attnlab.train.step import make_optimizer

from helpers import assert_cached_matches_uncached, sized


def conv_model(kernel_width: int = 3, seed: int = 0, dropout: float = 0.0, **fields):
    torch.manual_seed(seed)
    cfg, shape = sized(
        arch="convs2s",
        vocab_size=11,
        src_vocab_size=13,
        d_embed=6,
        d_model=8,
        n_layers=3,
        kernel_width=kernel_width,
        dropout=dropout,
        max_len=32,
        **fields,
    )
    return build_model(cfg, shape).eval()


def source_and_target(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(3, 13, (3, 7), generator=g), torch.randint(3, 11, (3, 6), generator=g)
    src[1, 5:] = 0  # padding
    src[2, 2:] = 0
    return src, tgt


def weight(module: torch.nn.Module) -> torch.Tensor:
    return module.weight.detach()  # the weight-normalised weight g v / |v|


def fairseq_fconv(model, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """fairseq 0.6.0's FConvEncoder / FConvDecoder / AttentionLayer forward in eval mode, in time-major
    layout, on ``model``'s weights: (B, T, V) logits."""
    enc, dec = model.encoder, model.decoder
    mask = src.eq(0).t()  # (S, B)
    e = enc.embed.tokens(src) + enc.embed.positional.table(torch.arange(src.shape[1]))  # (B, S, D)
    x = F.linear(e, weight(enc.fc_in), enc.fc_in.bias).transpose(0, 1)  # (S, B, C)
    for conv in enc.convs:
        residual = x
        x = x.masked_fill(mask.unsqueeze(-1), 0)
        k = conv.kernel_size[0]
        x = F.pad(x, (0, 0, 0, 0, (k - 1) // 2, k // 2))
        x = torch.conv_tbc(x, weight(conv).permute(2, 1, 0).contiguous(), conv.bias, 0)  # TBC weights (k, in, out)
        x = (F.glu(x, dim=2) + residual) * math.sqrt(0.5)
    x = F.linear(x.transpose(1, 0), weight(enc.fc_out), enc.fc_out.bias).masked_fill(mask.t().unsqueeze(-1), 0)
    encoder_a, encoder_b = x.transpose(1, 2), (x + e) * math.sqrt(0.5)  # (B, D, S), (B, S, D)

    target_embedding = dec.embed.tokens(tgt) + dec.embed.positional.table(torch.arange(tgt.shape[1]))  # (B, T, D)
    x = F.linear(target_embedding, weight(dec.fc_in), dec.fc_in.bias).transpose(0, 1)  # (T, B, C)
    for conv, attention in zip(dec.convs, dec.attention):
        residual = x
        k = conv.kernel_size[0]
        x = torch.conv_tbc(x.contiguous(), weight(conv).permute(2, 1, 0).contiguous(), conv.bias, k - 1)[
            : -(k - 1)
        ]  # LinearizedConv
        x = F.glu(x, dim=2).transpose(0, 1)  # (B, T, C)
        att_residual = x
        x = (F.linear(x, weight(attention.query), attention.query.bias) + target_embedding) * math.sqrt(0.5)
        x = torch.bmm(x, encoder_a).masked_fill(mask.t().unsqueeze(1), float("-inf")).softmax(dim=-1)
        x = torch.bmm(x, encoder_b)
        s = encoder_b.size(1) - mask.t().float().sum(dim=1, keepdim=True).unsqueeze(-1)
        x = x * (s * s.rsqrt())
        x = (F.linear(x, weight(attention.out), attention.out.bias) + att_residual) * math.sqrt(0.5)
        x = (x.transpose(0, 1) + residual) * math.sqrt(0.5)
    x = F.linear(x.transpose(0, 1), weight(dec.fc_out), dec.fc_out.bias)
    return F.linear(x, weight(dec.generator), dec.generator.bias)


@pytest.mark.parametrize("kernel_width", [3, 4])
def test_the_forward_equals_fairseqs_fconv(kernel_width):
    model = conv_model(kernel_width)
    src, tgt = source_and_target()
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), fairseq_fconv(model, src, tgt), rtol=0, atol=1e-5)


def test_the_decoder_sees_only_the_past_and_the_encoder_ignores_padding():
    model = conv_model()
    src, tgt = source_and_target()
    with torch.no_grad():
        logits = model(src, tgt)
        changed = tgt.clone()
        changed[:, 3:] = 4
        assert torch.equal(model(src, changed)[:, :3], logits[:, :3])
        padded = torch.cat([src, torch.zeros(3, 4, dtype=torch.long)], dim=1)
        torch.testing.assert_close(model(padded, tgt), logits, rtol=0, atol=1e-6)


def test_cached_decoding_equals_uncached_step_by_step_greedy_and_beam():
    model = conv_model(kernel_width=4)
    src, tgt = source_and_target()
    assert_cached_matches_uncached(model, tgt, src, atol=1e-6)
    assert_cached_matches_uncached(model, tgt, src, chunks=[2, 1, 3], atol=1e-6)
    with torch.no_grad():
        memory, valid = model.encode(src)
        cache = model.new_cache()
        steps = model.decode(tgt[:, :4], memory, valid, cache)
        cache.truncate(2)  # as speculative decoding rewinds: positions 2, 3 again give the same logits
        torch.testing.assert_close(model.decode(tgt[:, 2:4], memory, valid, cache), steps[:, 2:4], rtol=0, atol=1e-6)
    assert greedy(model, src, max_len=9) == greedy(model, src, max_len=9, use_cache=False)
    cached, uncached = (beam_search(model, src, beam=3, nbest=2, max_len=9, use_cache=c) for c in (True, False))
    assert [[h.tokens for h in b] for b in cached] == [[h.tokens for h in b] for b in uncached]
    assert [h.score for b in cached for h in b] == pytest.approx([h.score for b in uncached for h in b], abs=1e-5)


def test_the_initialisation_keeps_the_variance_it_is_designed_for():
    """Gehring et al. section 3.5: Linear weights N(0, (1 - p) / n_in), convolutions N(0, 4 (1 - p) / (k n_in)),
    embeddings N(0, 0.1^2) with a zero padding row."""
    torch.manual_seed(0)
    model = build_model(
        *sized(arch="convs2s", vocab_size=400, d_embed=200, d_model=300, n_layers=1, kernel_width=5, dropout=0.25)
    )
    enc = model.encoder
    assert weight(enc.fc_in).std().item() == pytest.approx(math.sqrt(0.75 / 200), rel=0.02)
    assert weight(enc.convs[0]).std().item() == pytest.approx(math.sqrt(4 * 0.75 / (5 * 300)), rel=0.02)
    assert weight(model.decoder.attention[0].query).std().item() == pytest.approx(math.sqrt(1 / 300), rel=0.02)
    assert enc.embed.tokens.weight.std().item() == pytest.approx(0.1, rel=0.02)
    assert torch.count_nonzero(enc.embed.tokens.weight[0]) == 0


def test_the_encoders_gradient_is_scaled_by_one_over_twice_the_attention_layers():
    src, tgt = source_and_target()
    grads = {}
    for scale in (None, 1.0):
        model = conv_model().double().train()
        if scale is not None:
            model.encoder.grad_scale = scale
        model(src, tgt).square().sum().backward()
        grads[scale] = model.encoder.convs[0].parametrizations.weight.original1.grad
    torch.testing.assert_close(grads[None], grads[1.0] / (2 * 3), rtol=1e-5, atol=0)


def test_nag_is_fairseqs_nag_at_a_constant_learning_rate():
    """fairseq/optim/nag.py: p += m^2 buf - (1 + m) lr g, then buf = m buf - lr g."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    expected = [p.detach().clone() for p in model.parameters()]
    buffers = [torch.zeros_like(p) for p in expected]
    optimizer = make_optimizer(model, TrainConfig(optimizer="nag", momentum=0.99))
    lr, m = 0.1, 0.99
    for group in optimizer.param_groups:
        group["lr"] = lr
    for step in range(4):
        optimizer.zero_grad()
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(step))
        model(x).pow(3).sum().backward()
        for p, q, buf in zip(model.parameters(), expected, buffers):
            q.add_(m * m * buf - (1 + m) * lr * p.grad)
            buf.mul_(m).add_(-lr * p.grad)
        optimizer.step()
        for p, q in zip(model.parameters(), expected):
            torch.testing.assert_close(p.detach(), q, rtol=1e-6, atol=1e-6)
            q.copy_(p.detach())  # the next step from the same point


def test_the_config_fails_early():
    with pytest.raises(ConfigError, match="kernel_width"):
        sized(arch="convs2s", vocab_size=11, kernel_width=1)
    with pytest.raises(ConfigError, match="dropout"):
        sized(arch="convs2s", vocab_size=11, dropout=1.0)
    with pytest.raises(ConfigError, match="momentum"):
        TrainConfig(optimizer="nag", momentum=1.0)


def test_a_run_trains_with_nag_and_evaluates_from_the_command_line(tmp_path, capsys):
    """Dessì & Baroni's recipe in miniature, on a tiny reversal task: the loss falls, and `attnlab
    evaluate` decodes the run's test split."""
    from attnlab.cli import main

    cfg = RunConfig.from_sections(
        {
            "model": {
                "arch": "convs2s",
                "d_embed": 16,
                "d_model": 16,
                "n_layers": 2,
                "kernel_width": 3,
                "dropout": 0.1,
            },
            "data": {
                "format": "builtin",
                "generator": {"name": "reverse", "min_len": 3, "max_len": 5},
                "text": {"tokenizer": "word"},
                "n_train": 200,
                "n_valid": 20,
                "n_test": 10,
            },
            "train": {
                "max_steps": 60,
                "max_tokens": 60,
                "optimizer": "nag",
                "lr_schedule": "constant",
                "lr": 0.1,
                "warmup_steps": 0,
                "clip_norm": 0.1,
                "label_smoothing": 0.0,
                "eval_every": 60,
                "log_every": 10,
                "progress": False,
            },
        }
    )
    summary = train_run(cfg, tmp_path / "run", log=lambda s: None)
    losses = [
        json.loads(line)["loss"]
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line).get("split") == "train"
    ]
    assert losses[-1] < losses[0] - 0.3, losses  # the run is seeded: 3.66 -> 3.13
    assert summary["steps"] == 60
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run"), "--split", "test", "--beam", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sentences"] == 10
