"""Attention backends against the explicit reference: exact ones to 1e-5 (outputs and gradients),
local and sparse against 'math' under the same pattern as an explicit mask, linear against its own
kernel formula, and cached decoding against uncached for every backend that decodes."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.nn.backends import (
    AttentionBackend,
    AutoBackend,
    ChunkedBackend,
    FeatureMap,
    LinearBackend,
    LocalBackend,
    SDPABackend,
    SparseBackend,
    SparsePattern,
)
from attnlab.nn.cache import KVCache
from attnlab.nn.masks import AttentionMask
from attnlab.nn.positional import ALiBiPositional

from helpers import assert_cached_matches_uncached, random_ids, sized, tiny_model

MATH = AttentionBackend()


def qkv(B=2, H=3, Tq=37, Tk=37, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=torch.float64).float().requires_grad_() for T in (Tq, Tk, Tk)]


def padded(B, Tk, lengths):
    valid = torch.zeros(B, Tk, dtype=torch.bool)
    for b, n in enumerate(lengths):
        valid[b, :n] = True
    return valid


def run(backend, q, k, v, mask, bias=None, q_pos=None, k_pos=None):
    q_pos = torch.arange(q.shape[2]) if q_pos is None else q_pos
    k_pos = torch.arange(k.shape[2]) if k_pos is None else k_pos
    out, _ = backend(q, k, v, mask, q_pos, k_pos, bias=bias)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    return out, grads


def assert_same(a, b, atol=1e-5):
    (out_a, grads_a), (out_b, grads_b) = a, b
    torch.testing.assert_close(out_a, out_b, atol=atol, rtol=0)
    for name, ga, gb in zip("qkv", grads_a, grads_b):
        torch.testing.assert_close(ga, gb, atol=atol, rtol=0, msg=lambda m: f"d{name}: {m}")


MASKS = {
    "none": lambda B, Tk: AttentionMask(),
    "padding": lambda B, Tk: AttentionMask(key_valid=padded(B, Tk, [Tk, Tk - 9])),
    "causal": lambda B, Tk: AttentionMask(causal=True),
    "both": lambda B, Tk: AttentionMask(key_valid=padded(B, Tk, [Tk, Tk - 9]), causal=True),
}


EXACT = [SDPABackend(), AutoBackend(), ChunkedBackend(q_block=8, k_block=16)]


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("backend", EXACT, ids=lambda b: b.name)
def test_exact_backends_equal_math(backend, mask):
    q, k, v = qkv()
    m = MASKS[mask](2, 37)
    assert_same(run(backend, q, k, v, m), run(MATH, q, k, v, m))


@pytest.mark.parametrize("backend", EXACT, ids=lambda b: b.name)
def test_exact_backends_with_a_score_bias_and_cross_attention_shapes(backend):
    alibi = ALiBiPositional(3)
    q, k, v = qkv(Tq=13, Tk=29)
    m = MASKS["padding"](2, 29)
    assert_same(run(backend, q, k, v, m, bias=alibi.score_bias), run(MATH, q, k, v, m, bias=alibi.score_bias))


def test_chunked_decoding_step_with_positions_after_a_prefix():
    """A query at position 20 over 21 cached keys, causal: the same as math (and block skipping)."""
    q, k, v = qkv(Tq=1, Tk=21)
    m = AttentionMask(causal=True)
    q_pos = torch.tensor([20])
    assert_same(run(ChunkedBackend(2, 4), q, k, v, m, q_pos=q_pos), run(MATH, q, k, v, m, q_pos=q_pos))


def test_fully_masked_rows_give_zeros_in_every_exact_backend():
    q, k, v = qkv(B=2, Tq=5, Tk=6)
    m = AttentionMask(key_valid=padded(2, 6, [6, 0]))
    for backend in (MATH, SDPABackend(), ChunkedBackend(2, 4)):
        out, _ = backend(q, k, v, m, torch.arange(5), torch.arange(6))
        assert torch.isfinite(out).all() and torch.equal(out[1], torch.zeros_like(out[1]))


def test_chunked_dropout_is_replayed_exactly_in_the_backward():
    """The checkpointed backward recomputes each block with the dropout masks of the forward: its
    gradients equal those of the same blocks run without checkpointing, under the same seed."""
    q, k, v = qkv(Tq=16, Tk=16)
    chunked = ChunkedBackend(q_block=4, k_block=8)
    m = AttentionMask(causal=True)
    pos = torch.arange(16)

    def direct():  # the same blocks, autograd keeping everything
        return torch.cat(
            [
                chunked._query_block(q[:, :, i : i + 4], k, v, m, pos[i : i + 4], pos, 0.3, None)
                for i in range(0, 16, 4)
            ],
            dim=2,
        )

    torch.manual_seed(7)
    out_ckpt, _ = chunked(q, k, v, m, pos, pos, dropout_p=0.3)
    grads_ckpt = torch.autograd.grad(out_ckpt.square().sum(), (q, k, v))
    torch.manual_seed(7)
    out_direct = direct()
    grads_direct = torch.autograd.grad(out_direct.square().sum(), (q, k, v))
    torch.testing.assert_close(out_ckpt, out_direct)
    for a, b in zip(grads_ckpt, grads_direct):
        torch.testing.assert_close(a, b)
    assert not torch.allclose(out_ckpt, run(MATH, q, k, v, m)[0])  # dropout did act


PATTERNS = {
    "window": SparsePattern(window=3, block=5),
    "window+stride": SparsePattern(window=2, stride=6, block=4),
    "global": SparsePattern(window=1, n_global=2, block=8),
    "bigbird": SparsePattern(window=2, stride=0, n_global=1, n_random=2, block=4, seed=3),
    "all": SparsePattern(window=4, stride=5, n_global=3, n_random=1, block=6, seed=1),
}


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_sparse_equals_math_under_the_pattern_as_an_explicit_mask(pattern, mask):
    p = PATTERNS[pattern]
    q, k, v = qkv()
    m = MASKS[mask](2, 37)
    pattern_mask = p.allowed(torch.arange(37), torch.arange(37), n_keys=37, causal=m.causal)
    structural = m.dense(torch.arange(37), torch.arange(37))
    explicit = pattern_mask if structural is None else structural & pattern_mask
    assert_same(run(SparseBackend(p), q, k, v, m), run(MATH, q, k, v, AttentionMask(explicit=explicit)))


def test_local_is_a_band_of_width_two_w_plus_one():
    window = SparsePattern(window=2).allowed(torch.arange(6), torch.arange(6), n_keys=6)
    assert window.int().tolist() == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [0, 1, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 1],
        [0, 0, 0, 1, 1, 1],
    ]
    q, k, v = qkv(Tq=23, Tk=23)
    band = AttentionMask(explicit=SparsePattern(window=4).allowed(torch.arange(23), torch.arange(23), n_keys=23))
    assert_same(run(LocalBackend(window=4, block=5), q, k, v, AttentionMask()), run(MATH, q, k, v, band))


def test_sparse_blocks_gather_only_their_candidates():
    """The point of the blockwise form: a query block of a long sequence touches O(window + T/stride)
    keys, not T (without global or random blocks)."""
    p = SparsePattern(window=8, stride=64, block=16)
    keys = p.candidate_keys(torch.arange(512, 528), torch.arange(4096))
    assert len(keys) == (528 + 8) - (512 - 8) + 4096 // 64 - 1  # the window, and 64 summaries less one inside it


def explicit_linear(q, k, v, phi, causal, key_valid=None):
    """out_i = sum_j [phi(q_i).phi(k_j)] v_j / sum_j phi(q_i).phi(k_j), over the keys i may see."""
    weights = phi(q) @ phi(k).transpose(-2, -1)  # (B, H, Tq, Tk)
    if causal:
        weights = weights.tril()
    if key_valid is not None:
        weights = weights * key_valid[:, None, None, :]
    return (weights @ v) / weights.sum(-1, keepdim=True)


@pytest.mark.parametrize("kind", ["elu", "favor"])
@pytest.mark.parametrize("causal", [False, True])
def test_linear_equals_its_kernel_formula(kind, causal):
    q, k, v = qkv(Tq=21, Tk=21)
    phi = FeatureMap(kind, d_head=8, n_features=16)
    valid = padded(2, 21, [21, 15])
    out, _ = LinearBackend(phi, chunk=4)(
        q, k, v, AttentionMask(key_valid=valid, causal=causal), torch.arange(21), torch.arange(21)
    )
    torch.testing.assert_close(out, explicit_linear(q, k, v, phi, causal, valid), atol=1e-5, rtol=1e-4)


def test_linear_recurrent_state_equals_the_parallel_form():
    q, k, v = qkv(Tq=19, Tk=19)
    backend = LinearBackend(FeatureMap("elu", 8), chunk=5)
    mask = AttentionMask(causal=True)
    full, _ = backend(q, k, v, mask, torch.arange(19), torch.arange(19))
    cache, steps, start = KVCache(), [], 0
    for size in (4, 1, 1, 7, 1, 5):
        rows = slice(start, start + size)
        out, _ = backend(
            q[:, :, rows],
            k[:, :, rows],
            v[:, :, rows],
            mask,
            torch.arange(start, start + size),
            torch.arange(start + size),
            cache=cache,
        )
        steps.append(out)
        start += size
    torch.testing.assert_close(torch.cat(steps, 2), full, atol=1e-5, rtol=1e-5)
    assert len(cache) == 19 and cache.k is None and cache.state.S.shape == (2, 3, 8, 8)  # O(1) in the length


def test_favor_features_estimate_softmax_attention():
    """Performer's estimator: the error against exact softmax attention shrinks as features grow."""
    q, k, v = (t.detach() * 0.5 for t in qkv(B=1, H=2, Tq=16, Tk=16, D=16))
    exact, _ = MATH(q, k, v, AttentionMask(), torch.arange(16), torch.arange(16))
    errors = []
    for m in (16, 1024):
        out, _ = LinearBackend(FeatureMap("favor", 16, m, seed=0))(
            q, k, v, AttentionMask(), torch.arange(16), torch.arange(16)
        )
        errors.append((out - exact).abs().mean().item())
    assert errors[1] < errors[0] / 2 and errors[1] < 0.05


BACKEND_CONFIGS = {
    "sdpa": dict(attention_backend="sdpa"),
    "auto": dict(attention_backend="auto"),
    "chunked": dict(attention_backend="chunked", backends=dict(block=3, chunked=dict(key_block=4))),
    "local": dict(attention_backend="local", backends=dict(block=4, pattern=dict(window=3))),
    "sparse": dict(
        attention_backend="sparse", backends=dict(block=4, pattern=dict(window=2, stride=4, n_global=1, n_random=1))
    ),
    "linear": dict(stack=dict(attention_backend="linear", attention_dropout=0.0), backends=dict(block=4)),
}


@pytest.mark.parametrize("name", sorted(BACKEND_CONFIGS))
@pytest.mark.parametrize("arch", ["decoder_lm", "encoder_decoder"])
def test_cached_decoding_equals_uncached_with_every_backend(name, arch):
    model = tiny_model(arch=arch, positions=dict(scheme="rotary"), **BACKEND_CONFIGS[name])
    tgt = random_ids(2, 11)
    src = random_ids(2, 9, generator_seed=1) if arch == "encoder_decoder" else None
    assert_cached_matches_uncached(model, tgt, src)
    assert_cached_matches_uncached(model, tgt, src, chunks=[5, 1, 1, 4])


@pytest.mark.parametrize("positional", ["alibi", "relative_bias"])
@pytest.mark.parametrize("name", ["sdpa", "auto", "chunked"])
def test_a_model_with_an_exact_backend_equals_the_math_model(name, positional):
    """Logits and every parameter's gradient (the learned relative-bias table's included)."""
    math_model = tiny_model(arch="encoder_decoder", positions=dict(scheme=positional), attention_backend="math")
    model = tiny_model(arch="encoder_decoder", positions=dict(scheme=positional), **BACKEND_CONFIGS[name])
    model.load_state_dict(math_model.state_dict())
    src, tgt = random_ids(2, 9), random_ids(2, 7, generator_seed=1)
    src[1, 6:] = 0  # padding
    out, ref = model(src, tgt), math_model(src, tgt)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    out.square().mean().backward()
    ref.square().mean().backward()
    for (name_, p), (_, p_ref) in zip(model.named_parameters(), math_model.named_parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name_}: {m}")


def test_only_math_returns_weights():
    q, k, v = qkv(Tq=4, Tk=4)
    for backend in (SDPABackend(), ChunkedBackend(), LocalBackend(2), LinearBackend(FeatureMap("elu", 8))):
        with pytest.raises(ValueError, match="use 'math'"):
            backend(q, k, v, AttentionMask(), torch.arange(4), torch.arange(4), need_weights=True)


def test_auto_takes_math_where_the_weights_are_needed_and_sdpa_elsewhere(monkeypatch):
    """Weights asked for: math's, exactly. Without: the fused kernel's output (within 1e-5 of math's)."""
    q, k, v = qkv(Tq=6, Tk=6)
    mask, pos = MASKS["both"](2, 6), torch.arange(6)
    out, weights = AutoBackend()(q, k, v, mask, pos, pos, need_weights=True)
    ref_out, ref_weights = MATH(q, k, v, mask, pos, pos, need_weights=True)
    assert torch.equal(out, ref_out) and torch.equal(weights, ref_weights)
    out, weights = AutoBackend()(q, k, v, mask, pos, pos)
    assert weights is None and torch.equal(out, SDPABackend()(q, k, v, mask, pos, pos)[0])


def test_auto_keeps_attnlabs_dropout_draws_on_the_cpu():
    """Attention dropout in training on the CPU: math, with attnlab's own draws (the fused CPU kernel
    has no dropout), so a CPU run is the same under auto and math."""
    q, k, v = qkv(Tq=6, Tk=6)
    mask, pos = MASKS["padding"](2, 6), torch.arange(6)
    outs = []
    for backend in (AutoBackend(), MATH):
        torch.manual_seed(3)
        outs.append(backend(q, k, v, mask, pos, pos, dropout_p=0.5)[0])
    assert torch.equal(*outs)


def test_auto_is_the_default_and_a_model_on_it_equals_math_in_shaws_relative_positions():
    """Shaw's value term needs the probabilities, so auto computes them as math does: equal logits."""
    assert sized(vocab_size=10)[0].stack.attention_backend == "auto"
    math_model = tiny_model(arch="decoder_lm", positions=dict(scheme="relative"), attention_backend="math")
    auto_model = tiny_model(arch="decoder_lm", positions=dict(scheme="relative"))
    ids = random_ids(2, 9)
    assert torch.equal(auto_model(ids), math_model(ids))


@pytest.mark.parametrize(
    "fields, says",
    [
        (dict(stack=dict(attention_backend="flash")), "attention_backend"),
        (
            dict(stack=dict(attention_backend="linear", attention_dropout=0.0), positions=dict(scheme="alibi")),
            "never forms scores",
        ),
        (dict(stack=dict(attention_backend="linear", attention_dropout=0.1)), "no attention probabilities to drop"),
        (
            dict(stack=dict(attention_backend="chunked"), positions=dict(scheme="relative")),
            "only attention_backend 'math'",
        ),
        (
            dict(stack=dict(attention_backend="sdpa"), backends=dict(pattern=dict(stride=4))),
            r"^backends.pattern.stride is only used with attention_backend 'sparse' \(attention_backend is 'sdpa'\)$",
        ),
        (
            dict(stack=dict(attention_backend="local"), backends=dict(pattern=dict(window=-1))),
            r"^backends.pattern.window must be >= 0 \(got -1\)$",
        ),
        (
            dict(
                stack=dict(attention_backend="linear", attention_dropout=0.0),
                backends=dict(linear=dict(feature_map="relu")),
            ),
            r"^backends.linear.feature_map must be one of 'elu', 'favor' \(got 'relu'\)$",
        ),
        (
            dict(backends=dict(chunked=dict(key_block="8"))),
            r"^backends.chunked.key_block must be an integer \(got '8'\)$",
        ),
        (
            dict(backends=dict(pattern=dict(size=3))),
            r"^unknown field 'size' in backends.pattern \(did you mean 'stride'\?\); its fields: window, stride, n_global, n_random$",
        ),
        (
            dict(window=3),
            r"^model.window is a field of model.backends.pattern: write it inside backends.pattern "
            r"\(backends: \{pattern: \{window: ...\}\}; --set model.backends.pattern.window=...\)$",
        ),
        (dict(stack=dict(attention_backend="chunked"), arch="rnn"), "model.arch 'rnn' has no field 'stack'"),
    ],
)
def test_impossible_combinations_are_rejected_with_the_reason(fields, says):
    with pytest.raises(ConfigError, match=says):
        stack = dict(d_model=16, n_heads=4, **fields.get("stack", {}))
        sized(**{**fields, "vocab_size": 10, "stack": stack})  # the first field refused is one of ``fields``


def test_chunked_memory_does_not_grow_with_the_square_of_t():
    """The chunked backward never holds a (T, T) matrix: at T = 2048 its largest saved tensor is a
    query block's (B, H, q_block, T) scores, 1/16 of the full matrix here."""
    q, k, v = qkv(B=1, H=1, Tq=2048, Tk=2048, D=4)
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = ChunkedBackend(q_block=128, k_block=2048)(
            q, k, v, AttentionMask(causal=True), torch.arange(2048), torch.arange(2048)
        )
    assert max(sizes) <= 2048 * 4  # the forward saves only the inputs of each checkpointed block
    sizes.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = MATH(q, k, v, AttentionMask(causal=True), torch.arange(2048), torch.arange(2048))
    assert max(sizes) == 2048 * 2048
    assert math.isfinite(out.sum().item())


def test_chunked_backward_peak_memory_grows_with_t_not_t_squared():
    """Measured (VmHWM) at T = 8192, one head: math keeps (T, T) matrices, 256 MiB each; chunked's
    forward + backward (its blocks plus some fixed allocator overhead) stays under half of one."""
    from attnlab.bench.attention import measure_peak

    T = 8192
    q, k, v = (torch.randn(1, 1, T, 8, requires_grad=True) for _ in range(3))
    pos = torch.arange(T)

    def fwd_bwd(backend):
        return lambda: torch.autograd.grad(backend(q, k, v, AttentionMask(causal=True), pos, pos)[0].sum(), (q, k, v))

    _, chunked = measure_peak(fwd_bwd(ChunkedBackend(q_block=128, k_block=1024)))
    _, reference = measure_peak(fwd_bwd(MATH))
    scores = T * T * 4
    assert reference > scores and chunked < scores / 2, (chunked, reference)
