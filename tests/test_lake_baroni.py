"""Lake & Baroni's (2018) training regime: teacher forcing with a probability per sequence (the
rest decoded free-running), batches of one example drawn with replacement, resumed exactly."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file

from attnlab import ConfigError
from attnlab.data.batching import collate_pairs
from attnlab.data.tokenizers import BOS, EOS
from attnlab.decode.search import beam_search, greedy
from attnlab.eval.likelihood import teacher_forced_loss
from attnlab.nn.losses import label_smoothed_nll
from attnlab.nn.transformer import Seq2Seq
from attnlab.runs.checkpoint_files import MODEL_FILE
from attnlab.runs.config import RunConfig
from attnlab.runs.data import prepare
from attnlab.runs.run_dir import RunDir
from attnlab.train.run import train_run

from helpers import assert_cached_matches_uncached, random_ids, sized, tiny_model

KINDS = ["none", "bahdanau", "luong", "lake_baroni"]  # the last: Lake & Baroni's decoder with Bahdanau's attention


def rnn_model(attention="bahdanau", **kw):
    if attention == "lake_baroni":
        kw |= dict(rnn_decoder="lake_baroni", bidirectional=False, score="additive", tie_embeddings="none")
        attention = "bahdanau"
    return tiny_model(
        arch="rnn", rnn_attention=attention, rnn_cell=kw.pop("cell", "lstm"), score=kw.pop("score", "general"), **kw
    )


def lake_baroni(attention, cell, n_layers=2, dropout=0.0, **kw):
    return tiny_model(
        arch="rnn",
        rnn_attention=attention,
        rnn_cell=cell,
        rnn_decoder="lake_baroni",
        bidirectional=False,
        score="additive",
        tie_embeddings="none",
        n_layers=n_layers,
        dropout=dropout,
        **kw,
    )


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_lake_baroni_decoder_without_attention_is_two_pytorch_rnns(cell):
    """No attention: the encoder's final (h, c) of both layers start the decoder, which reads the
    embeddings alone and predicts from its top state: the same as torch's RNNs run by hand on the
    unpadded sentences."""
    model = lake_baroni("none", cell)
    src, tgt = random_ids(2, 6, generator_seed=3), random_ids(2, 4, generator_seed=4)
    src[1, 4:] = 0
    with torch.no_grad():
        got = model(src, tgt)
        for b, length in enumerate([6, 4]):
            _, final = model.encoder.rnn(model.encoder.embed(src[b : b + 1, :length]))
            states, _ = model.decoder.rnn(model.decoder.embed(tgt[b : b + 1]), final)
            torch.testing.assert_close(got[b : b + 1], model.generator(states), atol=1e-5, rtol=0)


def test_lake_baroni_decoder_attends_from_the_previous_state():
    """With attention: c_t = sum_i softmax_i(v^T tanh(W s_{t-1} + U h_i)) h_i over the encoder's
    top states, fed with E y_{t-1} into the RNN; written out step by step with torch's LSTM."""
    model = lake_baroni("bahdanau", "lstm")
    src, tgt = random_ids(1, 5, generator_seed=6), random_ids(1, 4, generator_seed=7)
    score = model.decoder.score
    with torch.no_grad():
        h, (s, c) = model.encoder.rnn(model.encoder.embed(src))  # (1, S, D), (L, 1, D) each
        expected = []
        for t in range(4):
            e = score.v_a(torch.tanh(score.W_s(s[-1])[:, None] + score.W_h(h))).squeeze(-1)  # (1, S)
            context = (e.softmax(-1)[..., None] * h).sum(1)  # (1, D)
            out, (s, c) = model.decoder.rnn(torch.cat([model.decoder.embed(tgt[:, t]), context], -1)[:, None], (s, c))
            expected.append(model.generator(out))
        torch.testing.assert_close(model(src, tgt), torch.cat(expected, 1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("attention", ["none", "bahdanau"])
def test_lake_baroni_decoder_cached_uncached_padded_and_beam(attention):
    model = lake_baroni(attention, "lstm")
    src, tgt = random_ids(3, 7, generator_seed=2), random_ids(3, 6, generator_seed=3)
    src[1, 4:] = 0
    assert_cached_matches_uncached(model, tgt, src=src)
    with torch.no_grad():
        torch.testing.assert_close(model(src[1:2, :4], tgt[1:2]), model(src, tgt)[1:2], atol=1e-5, rtol=0)
    assert [h[0].tokens for h in beam_search(model, src, beam=1, lenpen=0.0, max_len=8)] == greedy(
        model, src, max_len=8
    )


def test_lake_baroni_decoder_checks():
    with pytest.raises(ConfigError, match="rnn_decoder 'lake_baroni' starts from the encoder's final states"):
        sized(vocab_size=10, d_model=16, arch="rnn", rnn_decoder="lake_baroni")  # bidirectional by default
    with pytest.raises(ConfigError, match="rnn_decoder 'lake_baroni' .* needs rnn_attention 'none' or 'bahdanau'"):
        sized(
            vocab_size=10,
            d_model=16,
            arch="rnn",
            rnn_decoder="lake_baroni",
            bidirectional=False,
            rnn_attention="luong",
            score="general",
        )
    with pytest.raises(ConfigError, match="rnn_decoder must be one of 'deep_output', 'lake_baroni'"):
        sized(vocab_size=10, d_model=16, arch="rnn", rnn_decoder="plain")


@pytest.mark.parametrize("attention", ["none", "bahdanau"])
def test_embedding_dropout_acts_on_the_embeddings_and_dropout_between_layers(attention):
    """``embedding_dropout`` (default: ``dropout``) drops both sides' embeddings, ``dropout`` the
    states between layers: one layer and embedding_dropout 0 leave nothing to drop, so a training
    forward equals the evaluation's; the default draws what embedding_dropout = dropout draws."""
    src, tgt = random_ids(2, 6, generator_seed=3), random_ids(2, 5, generator_seed=4)

    def logits(n_layers, train, seed=0, **kw):
        model = lake_baroni(attention, "lstm", n_layers=n_layers, dropout=0.5, **kw).train(train)
        torch.manual_seed(seed)
        with torch.no_grad():
            return model(src, tgt)

    torch.testing.assert_close(
        logits(1, True, embedding_dropout=0.0), logits(1, False, embedding_dropout=0.0), atol=0, rtol=0
    )
    assert not torch.allclose(logits(1, True), logits(1, False))  # the default drops embeddings at 0.5
    torch.testing.assert_close(logits(1, True), logits(1, True, embedding_dropout=0.5), atol=0, rtol=0)
    assert not torch.allclose(logits(2, True, embedding_dropout=0.0), logits(2, False, embedding_dropout=0.0))
    with pytest.raises(ConfigError, match=r"embedding_dropout must be in \[0, 1\) \(got 1.0\)"):
        sized(vocab_size=10, d_model=16, arch="rnn", embedding_dropout=1.0)


@pytest.mark.parametrize("attention", KINDS)
def test_teacher_forcing_0_decodes_what_greedy_decoding_does(attention):
    """Free-running training steps read the model's own argmax: on a fixed model (no dropout) the
    argmax of every step is greedy decoding's output, up to its EOS."""
    model = rnn_model(attention, dropout=0.0, teacher_forcing=0.0)
    src = random_ids(4, 6, generator_seed=5)
    src[1, 3:] = 0
    tgt_in = torch.full((4, 9), 7)  # what the decoder would read if forced: never read here
    tgt_in[:, 0] = BOS
    model.train()
    with torch.no_grad():
        logits = model(src, tgt_in)
        logits[..., [0, BOS]] = -torch.inf  # never an output: padding and the start token
        chosen = logits.argmax(-1).tolist()  # (B, T)
    model.eval()
    decoded = greedy(model, src, max_len=9)
    for row, tokens in zip(chosen, decoded):
        assert row[: len(tokens)] == tokens
        assert len(tokens) == 9 or row[len(tokens)] == EOS
    assert len({tuple(r) for r in chosen}) > 1  # the rows differ: each follows its own source


def test_teacher_forcing_1_is_todays_teacher_forced_loss_exactly():
    """p = 1 draws no coin (the RNG is untouched: dropout draws the same masks) and runs the
    teacher-forced forward: the loss and gradients equal Seq2Seq.forward's bit for bit."""
    model = rnn_model("bahdanau", dropout=0.3, teacher_forcing=1.0).train()
    batch = collate_pairs([([5, 6, 7], [8, 9, 10, 11]), ([6, 5], [9, 8])])
    torch.manual_seed(3)
    loss, nll = teacher_forced_loss(model, batch, 0.1)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.manual_seed(3)
    logits = Seq2Seq.forward(model, batch.src, batch.tgt_in)
    again, again_nll = label_smoothed_nll(logits, batch.tgt_out, 0.1, 0)
    again.backward()
    assert torch.equal(loss, again) and torch.equal(nll, again_nll)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))


@pytest.mark.parametrize("attention", KINDS)
def test_forced_rows_read_the_truth_and_free_rows_their_own_choice(attention):
    """In one batch, a forced row's logits are the teacher-forced ones; a free row's are those it
    gets alone with p = 0; the loss of every step reaches the weights (through the states; the
    integer choice itself has no gradient)."""
    model = rnn_model(attention, dropout=0.0).train()
    src, tgt_in = random_ids(3, 5, generator_seed=1), random_ids(3, 6, generator_seed=2)
    tgt_in[:, 0] = BOS
    forced = torch.tensor([True, False, True])
    mixed = model.free_running(src, tgt_in, forced)
    with torch.no_grad():
        torch.testing.assert_close(mixed[forced], Seq2Seq.forward(model, src, tgt_in)[forced], atol=1e-5, rtol=0)
        alone = model.free_running(src[1:2], tgt_in[1:2], torch.tensor([False]))
    torch.testing.assert_close(mixed[1:2], alone, atol=1e-5, rtol=0)
    assert not torch.allclose(mixed[1:2], Seq2Seq.forward(model, src, tgt_in)[1:2], atol=1e-3)
    mixed[1, -1].logsumexp(-1).backward()  # the last step of the free row alone
    assert model.encoder.rnn.weight_ih_l0.grad.abs().sum() > 0


def test_teacher_forcing_draws_one_coin_per_sequence_from_the_seed():
    model = rnn_model("none", dropout=0.0, teacher_forcing=0.5).train()
    src, tgt_in = random_ids(64, 4, generator_seed=1), random_ids(64, 5, generator_seed=2)
    tgt_in[:, 0] = BOS
    with torch.no_grad():
        teacher = Seq2Seq.forward(model, src, tgt_in)
        torch.manual_seed(11)
        out = model(src, tgt_in)
        torch.manual_seed(11)
        assert torch.equal(out, model(src, tgt_in))
        torch.manual_seed(11)
        coins = torch.rand(64) < 0.5
    same = (out - teacher).abs().amax(dim=(1, 2)) < 1e-5  # (B,): the rows that read the truth
    assert torch.equal(same, coins)
    assert 20 < int(coins.sum()) < 44


def test_teacher_forcing_is_a_probability():
    with pytest.raises(ConfigError, match=r"teacher_forcing is the probability .* \(got 1.5\)"):
        sized(vocab_size=10, d_model=16, arch="rnn", teacher_forcing=1.5)


def scan_run(**train):
    """Lake & Baroni's regime on a tiny reversal task: a 2-layer LSTM, teacher forcing 0.5, dropout
    0.5, one example an update drawn with replacement, Adam at PyTorch's defaults, clipping at 5."""
    return RunConfig.from_sections(
        {
            "model": {
                "arch": "rnn",
                "rnn_cell": "lstm",
                "rnn_attention": "none",
                "bidirectional": False,
                "d_model": 16,
                "n_layers": 2,
                "dropout": 0.5,
                "teacher_forcing": 0.5,
            },
            "data": {
                "format": "builtin",
                "generator": {"name": "reverse", "min_len": 3, "max_len": 5},
                "text": {"tokenizer": "word"},
                "n_train": 40,
                "n_valid": 10,
                "n_test": 10,
            },
            "train": {
                "max_steps": 12,
                "batch_size": 1,
                "sampling": "with_replacement",
                "optimizer": "adam",
                "lr_schedule": "constant",
                "lr": 0.001,
                "warmup_steps": 0,
                "beta2": 0.999,
                "eps": 1e-8,
                "label_smoothing": 0.0,
                "clip_norm": 5.0,
                "eval_every": 4,
                "log_every": 1,
                "progress": False,
                **train,
            },
        }
    )


def test_sampling_with_replacement_draws_single_examples_from_the_seed():
    cfg = scan_run()
    data = prepare(cfg.data, cfg.train)
    epoch = data.epoch_batches(0)
    assert len(epoch) == 40  # a virtual epoch: as many draws as examples
    assert all(
        epoch[k].src.shape[0] == 1 and epoch[k].n_targets == int((epoch[k].tgt_out != 0).sum()) for k in range(40)
    )
    sources = [tuple(epoch[k].src[0].tolist()) for k in range(40)]
    assert sources == [tuple(data.epoch_batches(0)[k].src[0].tolist()) for k in range(40)]  # the same draws again
    assert max(Counter(sources).values()) > 1  # with replacement: some example twice in one epoch
    assert sources != [tuple(data.epoch_batches(1)[k].src[0].tolist()) for k in range(40)]
    other_seed = prepare(cfg.data, dataclasses.replace(cfg.train, seed=2))
    assert sources != [tuple(other_seed.epoch_batches(0)[k].src[0].tolist()) for k in range(40)]


def test_sampling_with_replacement_resumes_exactly(tmp_path):
    """Stopped at step 8 and resumed, a run of single-example draws with teacher forcing 0.5 and
    dropout (coins and masks from the checkpointed RNG) logs the losses and ends at the weights of
    one that never stopped."""
    whole = tmp_path / "whole"
    train_run(scan_run(), whole, log=lambda s: None)
    parts = tmp_path / "parts"
    train_run(scan_run(max_steps=8), parts, log=lambda s: None)
    train_run(scan_run(), parts, resume=True, log=lambda s: None, allow_changes=True)
    losses = [
        {
            r["step"]: r["loss"]
            for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["split"] == "train"
        }
        for run in (whole, parts)
    ]
    assert sorted(losses[1]) == list(range(1, 13)) and losses[1] == losses[0]
    a, b = (load_file(RunDir(run).step_dir(12) / MODEL_FILE) for run in (whole, parts))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sampling_is_refused_for_a_task_that_batches_its_own_way(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("a b c d e f g h i j k l m n o p\n" * 20)
    cfg = RunConfig.from_sections(
        {
            "model": {"arch": "decoder_lm", "stack": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}},
            "data": {"task": "language_model", "format": "text", "train": str(text), "block_size": 8},
            "train": {"sampling": "with_replacement", "lr_schedule": "constant", "lr": 0.001, "warmup_steps": 0},
        }
    )
    with pytest.raises(ConfigError, match="train.sampling 'with_replacement' draws examples of a task that batches"):
        prepare(cfg.data, cfg.train)
    with pytest.raises(ConfigError, match="sampling must be one of 'epochs', 'with_replacement'"):
        RunConfig.from_sections({"train": {"sampling": "shuffled"}})


def test_oracle_length_evaluation_decodes_every_output_at_its_references_length(tmp_path, capsys):
    """`attnlab evaluate --oracle-length` (Lake & Baroni's length experiment): every hypothesis has
    as many tokens as its reference, greedy and beam alike, and the record says so (a mask-predict
    run refuses it: tests/test_mask_predict.py)."""
    from attnlab.cli import main
    from attnlab.decode.spec import Beam, Greedy
    from attnlab.eval.evaluate import evaluate
    from attnlab.runs.checkpoint import load_run
    from attnlab.runs.data import read_run_data

    run = tmp_path / "run"
    train_run(scan_run(), run, log=lambda s: None)
    model, tokenizers, _ = load_run(run, "last")
    test = read_run_data(RunDir(run), "test").splits["test"]
    sources, references = [e.src for e in test], [e.tgt for e in test]
    plain = evaluate(model, tokenizers, sources, references, Greedy())["hypotheses"]
    assert [len(h.split()) for h in plain] != [len(r.split()) for r in references]  # 12 updates: lengths still off
    for search in (Greedy(), Beam(width=3)):
        result = evaluate(model, tokenizers, sources, references, search, oracle_length=True)
        assert [len(h.split()) for h in result["hypotheses"]] == [len(r.split()) for r in references]
        assert result["oracle_length"] is True
    capsys.readouterr()  # what training printed
    assert main(["evaluate", str(run), "--split", "test", "--beam", "1", "--oracle-length", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["oracle_length"] is True and record["sentences"] == 10


def test_loss_reduction_sum_is_the_sequences_summed_loss():
    """'sum' backpropagates the loss summed over the update's target tokens (the PyTorch tutorial's
    loss += criterion(...) at every step): the gradients of 'mean' times the number of targets."""
    from attnlab.train.step import accumulate_gradients

    batch = collate_pairs([([5, 6, 7], [8, 9, 10, 11, 12])])
    grads = {}
    for reduction in ("mean", "sum"):
        model = rnn_model("none", dropout=0.0)
        cfg = dataclasses.replace(scan_run().train, loss_reduction=reduction)
        sums = accumulate_gradients(model, [batch], cfg)
        grads[reduction] = [p.grad for p in model.parameters()]
    assert sums["targets"] == 6  # five actions and EOS
    for mean, summed in zip(grads["mean"], grads["sum"]):
        torch.testing.assert_close(summed, 6 * mean, atol=1e-6, rtol=1e-5)
    with pytest.raises(ConfigError, match="loss_reduction must be one of 'mean', 'sum'"):
        RunConfig.from_sections({"train": {"loss_reduction": "total"}})
