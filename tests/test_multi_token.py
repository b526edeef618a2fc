"""Multi-token prediction (Gloeckle et al. 2024): the extra heads are h + FFN(LayerNorm(h)) read by
the shared output projection; the loss is the next-token loss plus each head's, weighted, on the
token it predicts; self-speculative decoding with the heads is plain greedy decoding token for
token, keeps the target's distribution when sampling, and accepts most proposals once the heads
have learnt a predictable text."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from scipy.stats import chisquare
from test_speculative import first_tokens, plain_greedy_lm, target_distribution

from attnlab.cli.main import main
from attnlab.data.batching import Batch
from attnlab.data.tokenizers import PAD
from attnlab.decode.speculative import Sampler, speculative_decode
from attnlab.errors import ConfigError
from attnlab.eval.likelihood import multi_token_loss, teacher_forced_loss

from helpers import random_ids, tiny_model

V = 23


def mtp_model(heads: int = 3, **fields) -> torch.nn.Module:
    return tiny_model(arch="decoder_lm", multi_token_heads=heads, **fields)


def trunk(model, ids: torch.Tensor) -> torch.Tensor:
    """(B, T, d_model): the decoder's output, before any head."""
    positions = model.embed.positions(0, ids.shape[1], ids.device)
    return model.decoder(model.embed(ids, positions), ids != PAD, positions)


def lm_batch(ids: torch.Tensor) -> Batch:
    """A language-model batch: inputs x_0 .. x_{T-2}, targets x_1 .. x_{T-1}."""
    return Batch(src=None, tgt_in=ids[:, :-1], tgt_out=ids[:, 1:])


def test_each_head_is_a_residual_feed_forward_block_read_by_the_shared_projection():
    model = mtp_model(heads=2, norm="post")
    ids = random_ids(2, 9, V)
    with torch.no_grad():
        logits = model(ids, ahead=True)  # (B, T, 1 + 2, V)
        h = trunk(model, ids)
        assert logits.shape == (2, 9, 3, V)
        torch.testing.assert_close(logits[:, :, 0], model(ids))
        for j, head in enumerate(model.heads, start=1):
            f, norm = head.ffn, head.residual.norm
            normed = (h - h.mean(-1, keepdim=True)) / (h.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
            normed = normed * norm.weight + norm.bias
            expected = (h + f.w_2(torch.relu(f.w_1(normed)))) @ model.generator.weight.T
            torch.testing.assert_close(logits[:, :, j], expected)
        torch.testing.assert_close(model(ids, last_only=True, ahead=True), logits[:, -1:])


def test_the_loss_adds_each_heads_weighted_cross_entropy_on_the_token_it_predicts():
    model = mtp_model(heads=2, multi_token_weight=0.3)
    ids = random_ids(3, 10, V, generator_seed=4)
    ids[0, 7:] = PAD  # a shorter row: its padded targets count nowhere
    batch = lm_batch(ids)
    loss, nll = multi_token_loss(model, batch)
    with torch.no_grad():
        logits = model(batch.tgt_in, ahead=True)
    ce = [
        F.cross_entropy(
            logits[:, : 9 - j, j].reshape(-1, V), batch.tgt_out[:, j:].reshape(-1), ignore_index=PAD, reduction="sum"
        )
        for j in range(3)
    ]  # head j at t predicts x_{t+1+j} = tgt_out[t + j]
    torch.testing.assert_close(nll, ce[0])
    torch.testing.assert_close(loss, ce[0] + 0.3 * (ce[1] + ce[2]))


def test_without_heads_the_loss_is_the_teacher_forced_loss():
    model = tiny_model(arch="decoder_lm")
    batch = lm_batch(random_ids(2, 8, V))
    assert len(model.heads) == 0 and model.head_weights == (1.0,)
    for got, expected in zip(multi_token_loss(model, batch, 0.1), teacher_forced_loss(model, batch, 0.1)):
        torch.testing.assert_close(got, expected)


def test_the_fields_are_checked():
    with pytest.raises(ConfigError, match="multi_token_heads"):
        mtp_model(heads=-1)
    with pytest.raises(ConfigError, match="multi_token_weight must be > 0"):
        mtp_model(multi_token_weight=0.0)
    with pytest.raises(ValueError, match="no multi-token heads"):
        speculative_decode(tiny_model(arch="decoder_lm"), None, prompt=random_ids(1, 3, V))


@pytest.mark.parametrize("positional", ["sinusoidal", "rotary", "alibi"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_self_speculation_with_the_heads_is_plain_greedy(positional, k):
    """Untrained heads: a poor draft, and still greedy's output token for token."""
    model = mtp_model(heads=3, positions=dict(scheme=positional))
    for seed in range(2):
        prompt = random_ids(1, 4, V, generator_seed=seed)
        got, stats = speculative_decode(model, None, prompt=prompt, k=k, max_new_tokens=30)
        assert got == plain_greedy_lm(model, prompt, 30)
        assert stats.target_passes == len(stats.accepted_runs) and stats.proposed <= k * stats.target_passes


def pooled_chisquare(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """The chi-square p-value with every cell expected fewer than 5 times pooled into one (the
    test's approximation needs about 5 per cell)."""
    small = expected < 5
    observed = torch.cat([counts[~small], counts[small].sum()[None]])
    wanted = torch.cat([expected[~small], expected[small].sum()[None]])
    return chisquare(observed, wanted * observed.sum() / wanted.sum()).pvalue


def test_self_speculative_sampling_keeps_the_target_distribution():
    """1,000 seeded samplings of two tokens, temperature 0.7, top-k 6. The first comes from the
    model's first pass, the second is the heads' first proposal, kept or replaced: it follows its
    exact marginal sum_x p(x) p(y | x), enumerated, and the heads' own distribution fails."""
    vocab, draws, sampling = 9, 1000, {"temperature": 0.7, "top_k": 6}
    model = mtp_model(heads=3, vocab_size=vocab)
    with torch.no_grad():
        model.generator.weight.mul_(4.0)
    prompt = torch.tensor([[5, 6, 7]])
    sampler = Sampler(**sampling)
    tokens = first_tokens(model, None, prompt, draws, **sampling)
    p = target_distribution(model, prompt, sampler)
    counts = torch.bincount(tokens[:, 0], minlength=vocab).float()
    assert counts[p == 0].sum() == 0
    assert pooled_chisquare(counts, draws * p) > 1e-3
    second = sum(
        p[x] * target_distribution(model, torch.cat([prompt, torch.tensor([[x]])], dim=1), sampler)
        for x in range(vocab)
        if p[x] > 0
    )
    with torch.no_grad():
        head = sampler.probs(model(prompt, ahead=True)[0, -1, 1].float().log_softmax(-1))  # q of the second token
    counts = torch.bincount(tokens[:, 1], minlength=vocab).float()
    assert counts[second == 0].sum() == 0
    assert pooled_chisquare(counts, draws * second) > 1e-3
    assert pooled_chisquare(counts, draws * head.clamp_min(1e-9)) < 1e-6


def test_heads_trained_on_a_predictable_text_draft_most_tokens():
    """A cycle of 7 tokens: after 150 Adam steps the next-token head and the 3 extra heads know it,
    so self-speculation accepts every proposal: 4 tokens per pass of the model."""
    model = mtp_model(heads=3).train()
    cycle = torch.arange(3, 10).repeat(20)  # 140 tokens
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(150):
        starts = torch.randint(0, len(cycle) - 17, (8,))
        batch = lm_batch(torch.stack([cycle[s : s + 17] for s in starts.tolist()]))
        loss, nll = multi_token_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    assert nll.item() / batch.tgt_out.numel() < 0.01
    got, stats = speculative_decode(model, None, prompt=cycle[None, :5], k=3, max_new_tokens=40, stop_at_eos=False)
    assert got == cycle[5:45].tolist()
    # every proposal kept: the first pass has none yet, the last needs only 3 more tokens
    assert stats.acceptance_rate == 1.0 and stats.accepted_runs == [0, *[3] * 9, 2]


def test_generate_drafts_with_the_runs_own_heads(tmp_path, capsys):
    """`generate --draft heads`: a run trained with multi_token_heads gives greedy's text."""
    text = tmp_path / "text.txt"
    text.write_text("abcdefgh" * 50)
    config = tmp_path / "lm.yaml"
    config.write_text(
        f"model: {{arch: decoder_lm, stack: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, "
        f"dropout: 0.0}}, multi_token_heads: 2}}\n"
        f"data: {{format: text, train: {text}, text: {{tokenizer: char}}, block_size: 16}}\n"
        f"train: {{max_steps: 60, batch_size: 8, lr_schedule: constant, lr: 0.01, warmup_steps: 5, "
        f"label_smoothing: 0.0, eval_every: 60, progress: false}}\n"
    )
    assert main(["train", str(config), "--out", str(tmp_path / "lm")]) == 0
    capsys.readouterr()
    common = [
        "generate",
        str(tmp_path / "lm"),
        "--prompt",
        "abc",
        "--max-new-tokens",
        "24",
        "--top-k",
        "1",
        "--seed",
        "0",
    ]
    assert main(common) == 0
    plain = capsys.readouterr().out
    assert main([*common, "--draft", "heads", "--speculate", "2"]) == 0
    drafted = capsys.readouterr()
    assert drafted.out == plain == "abc" + "defghabc" * 3 + "\n"
    # 24 tokens: the first pass proposes nothing, then 7 of 3 tokens, and 2 at the end
    assert drafted.err == (
        "speculative decoding, k 2: 15 of 15 draft tokens accepted (100.0%), 2.67 tokens per pass of the target\n"
    )
    assert main([*common, "--draft", "heads", "--speculate", "3"]) == 2
    assert capsys.readouterr().err.endswith(
        "has 2 multi-token heads, so its own draft proposes at most 2 tokens a pass\n"
    )
