"""The static KV cache and the CUDA-graph step (issue 18): decoding over preallocated buffers gives
the numbers of the growable cache and of no cache at all, step by step and through greedy, beam
search and sampling, for an encoder-decoder and a decoder-only model, with padding in the batch,
beam reorders and rows leaving the search; its buffers never move. On CUDA, the replayed graph
gives exactly what the same static cache gives eagerly."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from attnlab.decode.captured import CapturedStep
from attnlab.decode.search import beam_search, greedy
from attnlab.decode.session import DecodingSession, static_refusal
from attnlab.decode.spec import Sample, sample
from attnlab.errors import DataError
from attnlab.nn.cache import StaticDecoderCache

from helpers import eos_biased, random_ids, tiny_model

PAD, EOS = 0, 2
CACHES = [dict(kv_cache="static"), dict(kv_cache="dynamic"), dict(use_cache=False)]


def sources(device: str = "cpu") -> torch.Tensor:
    src = random_ids(4, 7, generator_seed=5)
    src[1, 4:] = PAD
    src[3, 2:] = PAD
    return src.to(device)


@torch.no_grad()
def run_steps(model: nn.Module, start: torch.Tensor, seq2seq: bool, **cache) -> list[torch.Tensor]:
    """A fixed script of steps through a DecodingSession: new tokens (PAD in some rows), beam-style
    reorders within rows 0-1 and 2-3 (rows repeated, rows swapped), a reorder across them and one
    that drops rows.
    Returns each step's (n, V) log-probabilities."""
    session = DecodingSession(model, src=start, **cache) if seq2seq else DecodingSession(model, prompt=start, **cache)
    session.reserve(6)
    g = torch.Generator().manual_seed(1)
    out, n = [session.step(session.start)], start.shape[0]
    for t in range(6):
        tokens = torch.randint(3, 23, (n, 1), generator=g)
        tokens[t % n] = PAD  # a row that has finished is fed PAD
        if t in (1, 2):  # beams: rows follow other rows of their own source (rows 0-1 and 2-3)
            session.reorder(torch.tensor([[1, 1, 2, 3], [0, 0, 3, 2]][t - 1]), same_sources=True)
        if t == 3:  # across sources
            session.reorder(torch.tensor([2, 1, 0, 3]))
        if t == 4:  # two rows leave the search
            n = 2
            session.reorder(torch.tensor([3, 1]))
            tokens = tokens[[3, 1]]
        out.append(session.step(tokens))
    return out


@pytest.mark.parametrize(
    "arch,positional,backend",
    [
        ("encoder_decoder", "sinusoidal", "math"),
        ("encoder_decoder", "relative", "math"),
        ("encoder_decoder", "rotary", "sdpa"),
        ("encoder_decoder", "alibi", "chunked"),
        ("decoder_lm", "learned", "math"),
        ("decoder_lm", "rotary", "sdpa"),
        ("decoder_lm", "alibi", "local"),
    ],
)
def test_every_step_gives_the_same_logprobs_with_a_static_cache(arch, positional, backend):
    model = tiny_model(arch=arch, positions=dict(scheme=positional), attention_backend=backend)
    start = sources()[[0, 0, 1, 1]] if arch == "encoder_decoder" else random_ids(4, 3, generator_seed=2)  # 2 x 2 beams
    static, dynamic, uncached = (run_steps(model, start, arch == "encoder_decoder", **c) for c in CACHES)
    for a, b, c in zip(static, dynamic, uncached):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        torch.testing.assert_close(a, c, atol=1e-5, rtol=0)


def test_greedy_beam_search_and_sampling_of_an_encoder_decoder():
    model = eos_biased(tiny_model(positions=dict(scheme="rotary")), 6.0)
    src = sources()
    results = [
        (
            greedy(model, src, max_len=12, **c),
            beam_search(model, src, beam=4, lenpen=0.6, nbest=4, max_len=12, **c),
            sample(model, Sample(max_len=12, seed=3, **c), src=src),
        )
        for c in CACHES
    ]
    (greedy_static, beams_static, sampled_static), *others = results
    assert sorted({len(row) for row in greedy_static}) == [4, 12]  # some stop at EOS, some at the limit
    ends = [sorted(len(h.tokens) for h in hyps) for hyps in beams_static]
    assert ends == [[5, 6, 7, 12], [1, 2, 3, 4], [12, 12, 12, 12], [4, 5, 6, 10]]  # sentences leave at different steps
    for greedy_other, beams_other, sampled_other in others:
        assert greedy_other == greedy_static and sampled_other == sampled_static
        for a, b in zip(beams_static, beams_other):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
            assert [h.normalized for h in a] == pytest.approx([h.normalized for h in b], abs=1e-5)


def test_sampling_of_a_decoder_only_model_with_finished_rows_and_a_sliding_context():
    lm = eos_biased(
        tiny_model(
            arch="decoder_lm",
            positions=dict(scheme="learned", max_len=10),
        ),
        5.0,
    )
    prompt = random_ids(4, 3, generator_seed=2)
    draw = lambda prompt, **kw: [
        sample(lm, Sample(max_len=12, seed=seed, **c, **kw), prompt=prompt) for c in CACHES for seed in (0, 1)
    ]
    stopped = draw(prompt)
    assert [[len(row) for row in rows] for rows in stopped[:2]] == [[10, 8, 1, 12], [12, 0, 1, 11]]  # some end early
    assert stopped[:2] == stopped[2:4] == stopped[4:]
    slid = draw(prompt, stop_at_eos=False)  # past max_len 10: a static session until the window, then the slide
    assert {len(row) for rows in slid for row in rows} == {12}
    assert slid[:2] == slid[2:4] == slid[4:]
    greedy_rows = draw(prompt, top_k=1, stop_at_eos=False)
    assert greedy_rows[:2] == greedy_rows[2:4] == greedy_rows[4:] and greedy_rows[0] == greedy_rows[1]
    beyond = draw(random_ids(4, 11, generator_seed=2))  # longer than max_len: slides from the first token
    assert beyond[:2] == beyond[2:4] == beyond[4:]


@torch.no_grad()
def test_a_compiled_step_decodes_as_the_eager_static_cache():
    """kv_cache 'compiled': the one-token step through torch.compile gives the eager static cache's
    log-probabilities step by step (to float tolerance) and its greedy tokens, for a decoder-only
    model and an encoder-decoder; the prompt runs eagerly."""
    lm = tiny_model(arch="decoder_lm", positions=dict(scheme="rotary"))
    prompt = random_ids(2, 3, generator_seed=4)
    eager, compiled = (DecodingSession(lm, prompt=prompt, kv_cache=kind) for kind in ("static", "compiled"))
    tokens = prompt
    for session in (eager, compiled):
        session.reserve(6)
    for _ in range(6):
        expected = eager.step(tokens)
        torch.testing.assert_close(compiled.step(tokens), expected, rtol=1e-5, atol=1e-5)
        tokens = expected.argmax(-1, keepdim=True)
    model = eos_biased(tiny_model(positions=dict(scheme="sinusoidal")), 6.0)
    assert greedy(model, sources(), max_len=12, kv_cache="compiled") == greedy(
        model, sources(), max_len=12, kv_cache="static"
    )


@torch.no_grad()
def test_the_static_buffers_stay_where_they_are():
    """Shapes and addresses fixed from the first step: the precondition of a CUDA graph."""
    model = tiny_model()
    session = DecodingSession(model, src=sources(), kv_cache="static")
    session.reserve(5)
    cache = session.cache
    assert isinstance(cache, StaticDecoderCache) and cache.capacity == 6  # BOS and 5 fed tokens
    session.step(session.start)
    buffers = lambda: [
        cache.valid,
        cache.memory_valid,
        cache.filled,
        *(t for kv in cache.self_attn + cache.cross_attn for t in (kv.k, kv.v)),
    ]
    first = buffers()
    assert cache.self_attn[0].k.shape == (4, 4, 6, 4)  # (B, H, capacity, Dh)
    for step in range(4):
        session.step(torch.full((4, 1), 5))
        session.reorder(torch.tensor([1, 1, 0, 2]), same_sources=step < 2)
    session.reorder(torch.tensor([3, 0]))  # two rows leave: the cache keeps all four
    session.step(torch.full((2, 1), 5))
    assert all(t is u and t.data_ptr() == u.data_ptr() for t, u in zip(buffers(), first))
    assert cache.filled.tolist() == [6] and cache.valid.shape == (4, 6)


def test_which_cache_a_decode_gets_and_what_is_refused():
    model = tiny_model()
    assert DecodingSession(model, src=sources()).kv_cache == "dynamic"  # auto on the CPU
    with pytest.raises(ValueError, match="kv_cache must be one of auto, dynamic, static, graph"):
        DecodingSession(model, src=sources(), kv_cache="fixed")
    with pytest.raises(ValueError, match="'graph' records CUDA graphs, and this decode runs on 'cpu'"):
        greedy(model, sources(), kv_cache="graph")
    linear = tiny_model(attention_backend="linear", positions=dict(scheme="rotary"))
    with pytest.raises(ValueError, match="backend 'linear' keeps its own decoding state"):
        greedy(linear, sources(), kv_cache="static")
    assert greedy(linear, sources(), max_len=5) == greedy(linear, sources(), max_len=5, kv_cache="dynamic")
    cuda = torch.device("cuda")  # asked, not used: what a CUDA decode would get
    assert static_refusal(tiny_model(), "graph", cuda) is None  # the default backend, 'auto'
    assert static_refusal(tiny_model(attention_backend="sdpa"), "graph", cuda) is None
    assert "training mode" in static_refusal(tiny_model().train(), "graph", cuda)
    assert "backend 'local' reads tensors on the host" in static_refusal(
        tiny_model(attention_backend="local"), "graph", cuda
    )
    with pytest.raises(DataError, match="beyond max_len"):
        tiny_model(positions=dict(scheme="learned", max_len=8)).new_cache(capacity=9)
    session = DecodingSession(model, src=sources(), kv_cache="static")
    with pytest.raises(RuntimeError, match="reserve"):
        session.step(session.start)


@pytest.mark.cuda  # skipped without a GPU (tests/conftest.py)
@pytest.mark.parametrize("backend", ["auto", "math", "sdpa"])
@torch.no_grad()
def test_a_replayed_cuda_graph_decodes_exactly_as_the_eager_static_cache(backend):
    model = eos_biased(tiny_model(positions=dict(scheme="rotary"), attention_backend=backend).cuda(), 6.0)
    src = sources("cuda")
    session = DecodingSession(model, src=src, kv_cache="graph")
    session.reserve(4)
    for _ in range(4):
        session.step(torch.full((4, 1), 5, device="cuda"))
    assert isinstance(session.next_logits, CapturedStep) and session.next_logits.graph is not None  # replayed
    for kind in ("graph", "static"):
        assert DecodingSession(model, src=src, kv_cache=kind).kv_cache == kind
    run = lambda kind: (
        greedy(model, src, max_len=12, kv_cache=kind),
        [
            [(h.tokens, h.score) for h in hyps]
            for hyps in beam_search(model, src, beam=4, nbest=4, max_len=12, kv_cache=kind)
        ],
        sample(model, Sample(max_len=12, seed=3, kv_cache=kind), src=src),
    )
    assert run("graph") == run("static")  # exactly: the same kernels on the same shapes
    lm = eos_biased(
        tiny_model(arch="decoder_lm", positions=dict(scheme="learned"), attention_backend=backend).cuda(), 5.0
    )
    prompt = random_ids(4, 3, generator_seed=2).cuda()
    draw = lambda kind: sample(lm, Sample(max_len=12, seed=0, kv_cache=kind), prompt=prompt)
    assert draw("graph") == draw("static") == draw("auto")


@pytest.mark.cuda  # skipped without a GPU (tests/conftest.py)
@torch.no_grad()
def test_an_earlier_sessions_graph_freed_by_the_collector_does_not_end_a_recording():
    """A finished session and its CapturedStep form a reference cycle, so only the cyclic collector
    frees the earlier batch's graph, whenever it happens to run: here, on purpose, in the middle of
    the next batch's recording (a hook on the decoder). Freeing a graph then is a CUDA error, as
    evaluating SCAN's test splits on an H100 showed, unless the recording collects first."""
    model = eos_biased(tiny_model(positions=dict(scheme="rotary")).cuda(), 6.0)
    src = sources("cuda")
    expected = greedy(model, src, max_len=12, kv_cache="static")

    def collect_while_recording(module, args):
        if torch.cuda.is_current_stream_capturing():
            gc.collect()

    hook = model.decoder.register_forward_pre_hook(collect_while_recording)
    gc.disable()
    try:
        session = DecodingSession(model, src=src, kv_cache="graph")
        session.reserve(4)
        for _ in range(3):
            session.step(torch.full((4, 1), 5, device="cuda"))
        earlier = weakref.ref(session.next_logits)
        assert session.next_logits.graph is not None
        del session
        assert earlier() is not None  # the cycle holds it
        assert greedy(model, src, max_len=12, kv_cache="graph") == expected
        assert earlier() is None
    finally:
        gc.enable()
        hook.remove()
