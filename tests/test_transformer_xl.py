"""Transformer-XL (Dai et al. 2019): a segment's attention over its memory against full attention
over [memory; segment]; reading in segments against one pass under each position's window; no
gradient into the memory; cached decoding (and generation) against reading the stored segments
again; the layout of consecutive segments and the task that carries the memory along it; the config
checks; the commands end to end."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from torch.testing import assert_close

from attnlab.data.batching import ContextSegmentBatch, lm_context_windows, lm_segments
from attnlab.data.tokenizers import BOS, PAD
from attnlab.decode.spec import Sample, sample
from attnlab.decode.speculative import speculative_decode
from attnlab.errors import ConfigError
from attnlab.models import build_model, model_config
from attnlab.nn.losses import label_smoothed_nll
from attnlab.nn.masks import AttentionMask
from attnlab.nn.memory import MemoryKV, SegmentMemory
from attnlab.tasks.segment_language_model import SegmentLanguageModelConfig

from helpers import assert_cached_matches_uncached, random_ids, run_cli, sized, tiny_model

RELATIVE = ["rotary", "relative", "relative_bias", "alibi", "none"]
SHAPES = [(4, 4), (4, 2), (3, 7), (5, 0)]  # (segment_length T, memory_length M): M = T, M < T, M > T, none


def xl(**fields) -> torch.nn.Module:
    """A tiny Transformer-XL; its segment length, a size of the data, 64 unless given."""
    return tiny_model(arch="transformer_xl", **{"segment_length": 64, **fields})


@pytest.mark.parametrize("positional", RELATIVE)
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_a_layer_over_a_segment_and_its_memory_is_full_attention_over_both(positional, norm):
    """The reference: the same layer over [memory; segment] at positions 0 .. M + T - 1 under a
    causal mask, the memory's own outputs dropped."""
    layer = xl(positions=dict(scheme=positional), norm=norm).decoder.layers[0]
    g = torch.Generator().manual_seed(0)
    memory, segment = torch.randn(2, 5, 16, generator=g), torch.randn(2, 4, 16, generator=g)  # (B, M, D), (B, T, D)
    positions = torch.arange(9)
    with torch.no_grad():
        expected = layer(torch.cat([memory, segment], 1), AttentionMask(causal=True), (positions, positions))[:, 5:]
        kv = MemoryKV(*layer.memory_keys_values(memory, positions[:5]))
        got = layer(segment, AttentionMask(causal=True), (positions[5:], positions), kv)
    assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("positional", RELATIVE)
@pytest.mark.parametrize("T,M", SHAPES)
def test_reading_in_segments_is_one_pass_where_each_position_sees_its_window(positional, T, M):
    """Position i of segment i // T sees keys i // T * T - M .. i at every layer, which are states
    computed under their own windows: the segment-level recurrence, written as one masked pass."""
    model = xl(positions=dict(scheme=positional), segment_length=T, memory_length=M, norm="pre")
    ids = random_ids(2, 17)
    p = torch.arange(17)
    window = (p[None, :] <= p[:, None]) & (p[None, :] >= p[:, None] // T * T - M)  # (query, key)
    with torch.no_grad():
        y = model.embed(ids, p)
        for layer in model.decoder.layers:
            y = layer(y, AttentionMask(explicit=window), (p, p))
        expected = model.generator(model.decoder.norm(y))
        assert_close(model(ids), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("n_layers,earliest", [(1, 8), (2, 4), (3, 0)])
def test_the_context_reaches_one_memory_further_back_with_every_layer(n_layers, earliest):
    """T = M = 4: position 15 sees 8 .. 15 in layer 1; through N layers, 12 - 4 N .. 15."""
    model = xl(segment_length=4, memory_length=4, n_layers=n_layers)
    ids = random_ids(1, 16)
    with torch.no_grad():
        last = model(ids)[0, -1]
        reached = []
        for j in range(16):
            changed = ids.clone()
            changed[0, j] = ids[0, j] % 22 + 1  # another token, never PAD
            reached.append(not torch.allclose(model(changed)[0, -1], last, atol=1e-6, rtol=0))
    assert reached == [j >= earliest for j in range(16)]


def test_no_gradient_flows_into_the_memory():
    """The second segment's gradients are the same whether the first was read with a graph or not:
    its states enter the memory detached (SG), and only the segment's own computation is trained."""
    model = xl(segment_length=4, memory_length=4).train()
    ids = random_ids(2, 8)

    def gradients(first_with_graph: bool) -> dict[str, torch.Tensor]:
        model.zero_grad()
        memory = SegmentMemory()
        with torch.set_grad_enabled(first_with_graph):
            model(ids[:, :4], memory=memory)
        assert memory.length == 4 and not any(s.requires_grad for s in memory.states)
        model(ids[:, 4:], memory=memory).square().sum().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    with_graph, without = gradients(True), gradients(False)
    for name, grad in with_graph.items():
        assert_close(grad, without[name], atol=0, rtol=0, msg=name)
    assert with_graph["decoder.layers.0.self_attn.qkv_proj.weight"].abs().sum() > 0


def test_the_memory_keeps_the_last_positions_of_every_layer():
    model = xl(segment_length=4, memory_length=6)
    memory = SegmentMemory()
    with torch.no_grad():
        for length in (4, 6, 6):  # 4 positions, then the last 6 of 8, then of 10
            model(random_ids(3, 4), memory=memory)
            assert memory.length == length and memory.valid.all()
            assert [tuple(s.shape) for s in memory.states] == [(3, length, 16)] * 2


@pytest.mark.parametrize("positional", RELATIVE)
@pytest.mark.parametrize("T,M", SHAPES)
def test_cached_decoding_with_memory_equals_reading_the_stored_segments_again(positional, T, M):
    """The uncached pass reads the whole text in segments from an empty memory; the cached decode
    feeds it one token at a time, or in passes across segment boundaries."""
    model = xl(positions=dict(scheme=positional), segment_length=T, memory_length=M, norm="pre")
    ids = random_ids(2, 17)
    assert_cached_matches_uncached(model, ids)
    assert_cached_matches_uncached(model, ids, chunks=[6, 1, 5, 2, 3])
    cache = model.new_cache()
    with torch.no_grad():
        for t in range(17):
            model(ids[:, t : t + 1], cache=cache)
            assert len(cache.self_attn[0]) <= M + T  # the positions before the window are forgotten


def test_a_pass_taken_back_leaves_the_cache_as_if_never_fed():
    """Speculative decoding takes back rejected positions (truncate), never before the last pass."""
    model = xl(segment_length=4, memory_length=2)
    ids = random_ids(1, 14)
    cache = model.new_cache()
    with torch.no_grad():
        model(ids[:, :6], cache=cache)
        model(ids[:, 6:11], cache=cache)  # crosses the segment boundary at 8
        cache.truncate(7)
        assert_close(model(ids[:, 7:14], cache=cache), model(ids)[:, 7:], atol=1e-5, rtol=0)


def test_generation_carries_the_memory():
    """Sampling with the cache draws what sampling by reading every stored segment again draws, far
    past one segment and its memory; the log-probabilities agree to 1e-5 at every step (above)."""
    model = xl(segment_length=4, memory_length=4)
    prompt = random_ids(3, 6)

    def drawn(use_cache: bool) -> list[list[int]]:
        return sample(model, Sample(max_len=30, seed=7, stop_at_eos=False, use_cache=use_cache), prompt=prompt)

    assert drawn(True) == drawn(False)


def test_greedy_speculation_with_a_memory_is_plain_greedy():
    target, draft = xl(segment_length=4, memory_length=4), xl(segment_length=4, memory_length=2, n_layers=1)
    prompt = random_ids(1, 5)
    ids, expected = prompt, []
    with torch.no_grad():
        for _ in range(25):
            logits = target(ids)[0, -1]  # the whole text read again, segment by segment
            logits[[PAD, BOS]] = -torch.inf
            expected.append(int(logits.argmax()))
            ids = torch.cat([ids, torch.tensor([[expected[-1]]])], dim=1)
    for k in (1, 3):
        got, _ = speculative_decode(target, draft, prompt=prompt, k=k, max_new_tokens=25, stop_at_eos=False)
        assert got == expected


def test_consecutive_segments_row_i_continues_row_i():
    stream = torch.arange(1, 104)  # 103 tokens: 4 rows of 25 inputs, each with its next token
    batches = lm_segments(stream, segment_length=8, rows=4)
    assert [b.tgt_in.shape for b in batches] == [(4, 8)] * 3 + [(4, 1)]
    assert torch.equal(torch.cat([b.tgt_in for b in batches], 1), stream[:100].view(4, 25))
    assert torch.equal(torch.cat([b.tgt_out for b in batches], 1), stream[1:101].view(4, 25))
    assert [b.index for b in batches] == [0, 1, 2, 3] and all(b.rows is batches[0].rows for b in batches)
    assert lm_segments(torch.arange(1, 20), 8, rows=4)[0].tgt_in.shape[0] == 2  # as many rows as whole segments


def test_the_task_carries_the_memory_from_one_batch_to_the_next():
    """The losses of the batches in order equal each row read as one text; a batch that does not
    follow the last one read (a resumed run) starts from an empty memory."""
    model = xl(segment_length=4, memory_length=4)
    stream = random_ids(1, 41)[0]
    batches = lm_segments(stream, 4, rows=2)  # rows stream[0:20] and stream[20:40]
    loss = SegmentLanguageModelConfig().task.loss
    with torch.no_grad():
        in_order = sum(loss(model, b, 0.0, contextlib.nullcontext)[1] for b in batches)
        rows, targets = stream[:40].view(2, 20), stream[1:41].view(2, 20)
        assert_close(in_order, label_smoothed_nll(model(rows), targets, 0.0, PAD)[1], atol=1e-4, rtol=1e-6)
        resumed = loss(model, batches[3], 0.0, contextlib.nullcontext)[1]
        alone = label_smoothed_nll(model(batches[3].tgt_in), batches[3].tgt_out, 0.0, PAD)[1]
        assert_close(resumed, alone, atol=1e-5, rtol=1e-6)


def test_a_context_window_is_consecutive_text_ending_in_the_segment_trained_on():
    stream = torch.arange(1, 201)
    batch = lm_context_windows(
        stream, segment_length=8, batch_size=5, generator=torch.Generator().manual_seed(0), context_segments=2
    )
    assert (batch.context.shape, batch.tgt_in.shape, batch.tgt_out.shape) == ((5, 16), (5, 8), (5, 8))
    whole = torch.cat([batch.context, batch.tgt_in, batch.tgt_out[:, -1:]], dim=1)  # (5, 25)
    assert torch.equal(whole - whole[:, :1], torch.arange(25).expand(5, 25))  # 25 consecutive tokens a row
    assert torch.equal(batch.tgt_out, batch.tgt_in + 1) and len(set(whole[:, 0].tolist())) == 5
    again = lm_context_windows(stream, 8, 5, torch.Generator().manual_seed(0), context_segments=2)
    assert torch.equal(again.context, batch.context)  # a batch depends on its generator alone


@pytest.mark.parametrize("context_segments", [1, 2])
def test_a_context_windows_segment_is_trained_after_the_memory_its_context_leaves(context_segments):
    """The reference: the whole window read in segments (memory carried, SG), the loss of its last
    segment alone. The loss and every gradient are the same: no gradient reaches the context."""
    model = xl(segment_length=4, memory_length=4)
    batch = lm_context_windows(random_ids(1, 60)[0], 4, 3, torch.Generator().manual_seed(1), context_segments)
    loss, nll = SegmentLanguageModelConfig().task.loss(model, batch, 0.0, contextlib.nullcontext)
    loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    window = torch.cat([batch.context, batch.tgt_in], dim=1)
    ref_loss, ref_nll = label_smoothed_nll(model(window)[:, -4:], batch.tgt_out, 0.0, PAD)
    ref_loss.backward()
    assert_close(nll, ref_nll, atol=1e-5, rtol=1e-6)
    for g, p in zip(got, model.parameters()):
        assert_close(g, p.grad, atol=1e-6, rtol=1e-5)
    empty = SegmentLanguageModelConfig().task.loss(
        model, ContextSegmentBatch(None, batch.tgt_in, batch.tgt_out, batch.context[:, :0]), 0.0, contextlib.nullcontext
    )
    alone = label_smoothed_nll(model(batch.tgt_in), batch.tgt_out, 0.0, PAD)
    assert_close(empty[1], alone[1], atol=1e-5, rtol=1e-6)  # no context: an empty memory


@pytest.mark.parametrize(
    "fields,message",
    [
        (
            dict(positions=dict(scheme="learned")),
            r"positions.scheme 'learned' numbers positions from the start of the input, and "
            r"Transformer-XL moves states from the segment into the memory: use one of "
            r"'relative', 'relative_bias', 'rotary', 'alibi', 'none'",
        ),
        (dict(positions=dict(scheme="sinusoidal")), r"^positions.scheme 'sinusoidal' numbers positions"),
        (
            dict(stack=dict(attention_backend="chunked")),
            r"attention_backend 'chunked' takes padding and causality only; "
            r"Transformer-XL's decoding window is an explicit mask; use 'math' or 'sdpa' "
            r"or 'auto'",
        ),
        (
            dict(stack=dict(attention_backend="linear", dropout=0.0)),
            r"attention_backend 'linear' takes padding and causality only",
        ),
        (dict(memory_length=-1), r"memory_length must be >= 0 \(got -1\)"),
        (dict(segment_length=0), r"^shape.segment_length must be at least 1 \(got 0\)$"),  # a size of the data
        (dict(multi_token_heads=2), r"model.arch 'transformer_xl' has no field 'multi_token_heads'"),
    ],
)
def test_a_bad_model_section_fails_when_built_in_one_line(fields, message):
    with pytest.raises(ConfigError, match=message) as err:
        stack = dict(d_model=16, n_heads=2, **fields.get("stack", {}))
        sized(**{"arch": "transformer_xl", "vocab_size": 10, "segment_length": 4, **fields, "stack": stack})
    assert "\n" not in str(err.value)


def test_the_segment_length_is_the_datas_never_the_model_sections():
    """Issue 61: T comes with the data's shape (data.block_size in a run), and the model reads it there."""
    assert xl(segment_length=5, memory_length=3).segment_length == 5
    with pytest.raises(
        ConfigError, match=r"^model.segment_length is set by the data, not the model section: remove it$"
    ):
        model_config(arch="transformer_xl", segment_length=5)
    cfg, shape = sized(arch="transformer_xl", vocab_size=10)
    with pytest.raises(
        ConfigError, match=r"^arch 'transformer_xl' needs segment_length from its data, which gives none$"
    ):
        build_model(cfg, shape)


TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 40


def tiny_config(tmp_path, model: dict | None = None, data: dict | None = None) -> str:
    """A tiny training config; a model field given as None is left out."""
    (tmp_path / "text.txt").write_text(TEXT)
    model = {
        "arch": "transformer_xl",
        "stack": {"d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32, "dropout": 0.0, "norm": "pre"},
        "memory_length": 8,
        **(model or {}),
    }
    sections = {
        "model": {k: v for k, v in model.items() if v is not None},
        "data": {
            "task": "segment_language_model",
            "train": str(tmp_path / "text.txt"),
            "text": {"tokenizer": "char"},
            "block_size": 8,
            **(data or {}),
        },
        "train": {
            "max_steps": 20,
            "batch_size": 4,
            "lr": 0.01,
            "lr_schedule": "constant",
            "eval_every": 10,
            "progress": False,
        },
    }
    path = tmp_path / "xl.yaml"
    path.write_text(json.dumps(sections))
    return str(path)


@pytest.mark.parametrize(
    "model,data,message",
    [
        (
            {"arch": "decoder_lm", "memory_length": None},
            {},
            "model.arch must be 'transformer_xl' for data.task 'segment_language_model'; got 'decoder_lm'",
        ),
        (
            {},
            {"task": "language_model"},
            "model.arch must be 'decoder_lm' for data.task 'language_model'; got 'transformer_xl'",
        ),
        ({"segment_length": 8}, {}, "model.segment_length is set by the data, not the model section: remove it"),
    ],
)
def test_a_run_config_that_mixes_the_layouts_is_refused_in_one_line(tmp_path, model, data, message):
    done = run_cli("train", tiny_config(tmp_path, model, data), "--out", str(tmp_path / "run"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 3 and len(lines) == 1 and message in lines[0]


def test_training_on_context_windows_from_the_command_line(tmp_path):
    run = str(tmp_path / "run")
    done = run_cli("train", tiny_config(tmp_path, data={"context_segments": 1}), "--out", run)
    assert done.returncode == 0, done.stderr
    assert (
        "trained on random windows of 1 context segment(s) and one segment of 8 tokens, validated on 4 rows "
        "of consecutive segments"
    ) in done.stdout + done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    scored = json.loads(run_cli("evaluate", run, "--split", "valid", "--json").stdout)
    assert scored["loss"] == pytest.approx(summary["best_valid_loss"], abs=1e-6) and summary["steps"] == 20
    for data, message in [
        ({"context_segments": -1}, "xl.yaml: context_segments must be >= 0 (got -1)"),
        (
            {"context_segments": 400},
            "text.txt: the train text has 3060 tokens, fewer than a "
            "window of (data.context_segments + 1) x data.block_size + 1 "
            "(3209)",
        ),
    ]:
        refused = run_cli("train", tiny_config(tmp_path, data=data), "--out", str(tmp_path / "refused"))
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode != 0 and len(lines) == 1 and message in lines[0], refused.stderr


def test_train_evaluate_and_generate_from_the_command_line(tmp_path):
    run = str(tmp_path / "run")
    done = run_cli("train", tiny_config(tmp_path), "--out", run)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "read as 4 rows of consecutive segments of 8 tokens" in done.stdout + done.stderr

    scored = run_cli("evaluate", run, "--split", "valid", "--json")  # the validation, memory carried
    assert scored.returncode == 0, scored.stderr
    record = json.loads(scored.stdout)
    assert record["loss"] == pytest.approx(summary["best_valid_loss"], abs=1e-6)
    assert (record["segment_length"], record["memory_length"]) == (8, 8)
    scored = run_cli("evaluate", run, "--data", str(tmp_path / "text.txt"))
    assert scored.returncode == 0 and "1 row of segments of 8 tokens, memory 8" in scored.stdout

    generated = run_cli("generate", run, "--prompt", "To be", "--max-new-tokens", "40", "--top-k", "1")
    assert generated.returncode == 0 and generated.stdout.startswith("To be") and len(generated.stdout) > 40

    for args, message in [
        (("score", run, "--tgt", str(tmp_path / "text.txt")), "`attnlab score` needs data.task"),
        (("generate", run, "--kv-cache", "static"), "has no static cache; use kv_cache 'dynamic'"),
        (("evaluate", run), "give --data FILE, or --split NAME"),
        (("evaluate", run, "--data", str(tmp_path / "missing.txt")), "missing.txt: no such file"),
    ]:
        refused = run_cli(*args)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode != 0 and len(lines) == 1 and message in lines[0], refused.stderr
