"""attention() and MultiHeadAttention against PyTorch's references and the seeds' worked numbers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn import CrossAttention, KVCache, MultiHeadAttention, SelfAttention, causal_mask, padding_mask
from attnlab.nn.scores import attention

from helpers import with_weights


def qkv(B=2, H=3, Tq=5, Tk=5, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, Tq, D, generator=g),
        torch.randn(B, H, Tk, D, generator=g),
        torch.randn(B, H, Tk, D, generator=g),
    )


def test_softmax_worked_example():
    """Seed 003: softmax([1.0, -0.55, 1.1]) = [0.431, 0.092, 0.477] (exactly 0.4315, 0.0916, 0.4769:
    the notes truncate the first to three places)."""
    q = torch.tensor([[1.0]])
    k = torch.tensor([[1.0], [-0.55], [1.1]])
    out, probs = attention(q, k, torch.eye(3), temperature=1.0, need_weights=True)
    torch.testing.assert_close(probs, torch.tensor([[0.431, 0.092, 0.477]]), atol=1e-3, rtol=0)
    torch.testing.assert_close(out, probs)  # values are one-hot, so the output is the weights


def test_cat_query_worked_example():
    """Seed 004: the decoder query for 'chat' over 'the cat sat on the mat', d_k = 4.

    The notes compute the output [0.223, 0.135, 0.237, 0.574] from weights rounded to two places;
    with exact weights it is [0.2213, 0.1333, 0.2334, 0.5756]."""
    q = torch.tensor([[0.9, 0.1, 0.2, 0.3]])
    k = torch.tensor(
        [
            [0.0, 0.0, 0.0, 1.0],
            [1.0, 0.0, 0.3, 0.0],
            [0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 1.0],
            [0.0, 0.0, 1.0, 0.0],
        ]
    )
    v = torch.tensor(
        [
            [0.1, 0.0, 0.0, 0.8],
            [0.9, 0.0, 0.1, 0.7],
            [0.0, 0.9, 0.0, 0.3],
            [0.0, 0.0, 0.5, 0.0],
            [0.0, 0.0, 0.0, 0.9],
            [0.0, 0.0, 0.9, 0.6],
        ]
    )
    scaled = torch.tensor([[0.15, 0.48, 0.05, 0.00, 0.15, 0.10]])
    out, probs = attention(q, k, v, need_weights=True)  # temperature defaults to sqrt(4) = 2
    torch.testing.assert_close(probs, scaled.softmax(-1))
    torch.testing.assert_close(probs, torch.tensor([[0.16, 0.23, 0.15, 0.14, 0.16, 0.16]]), atol=5e-3, rtol=0)
    notes_weights = torch.tensor([[0.16, 0.23, 0.15, 0.14, 0.16, 0.16]])
    torch.testing.assert_close(notes_weights @ v, torch.tensor([[0.223, 0.135, 0.237, 0.574]]))
    torch.testing.assert_close(out, torch.tensor([[0.223, 0.135, 0.237, 0.574]]), atol=4e-3, rtol=0)
    assert probs.argmax().item() == 1  # 'cat'


@pytest.mark.parametrize("masking", ["none", "padding", "causal", "padding+causal"])
def test_attention_matches_sdpa(masking):
    q, k, v = qkv()
    valid = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    pos = torch.arange(5)
    mask = {
        "none": None,
        "padding": padding_mask(valid),
        "causal": causal_mask(pos, pos),
        "padding+causal": padding_mask(valid) & causal_mask(pos, pos),
    }[masking]
    out, probs = attention(q, k, v, mask, need_weights=True)
    if masking == "causal":
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3, 5))
    assert attention(q, k, v, mask)[1] is None  # weights only on request


def test_temperature_and_bias():
    q, k, v = qkv(Tq=4, Tk=6)
    bias = torch.randn(1, 3, 4, 6)
    out, _ = attention(q, k, v, temperature=0.5, bias=bias)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=2.0)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_fully_masked_row_gives_zeros_not_nan():
    q, k, v = qkv(B=1, H=1, Tq=3, Tk=4)
    q.requires_grad_(True)
    mask = torch.tensor([[True, True, False, False], [False, False, False, False], [True, False, False, False]])
    out, probs = attention(q, k, v, mask, need_weights=True)
    assert torch.equal(out[0, 0, 1], torch.zeros(8)) and torch.equal(probs[0, 0, 1], torch.zeros(4))
    torch.testing.assert_close(probs[0, 0, 0].sum(), torch.tensor(1.0))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.equal(q.grad[0, 0, 1], torch.zeros(8))


def test_dropout_scales_kept_weights():
    q, k, v = qkv()
    _, clean = attention(q, k, v, need_weights=True)
    torch.manual_seed(1)
    out, dropped = attention(q, k, v, dropout_p=0.5, need_weights=True)
    kept = dropped != 0
    assert 0.3 < kept.float().mean() < 0.7
    torch.testing.assert_close(dropped[kept], 2.0 * clean[kept])
    torch.testing.assert_close(out, dropped @ v)  # the dropped weights are the ones applied


def copy_from_torch(ours: MultiHeadAttention, ref: torch.nn.MultiheadAttention) -> None:
    D = ref.embed_dim
    with torch.no_grad():
        if isinstance(ours, CrossAttention):
            ours.q_proj.weight.copy_(ref.in_proj_weight[:D])
            ours.q_proj.bias.copy_(ref.in_proj_bias[:D])
            ours.kv_proj.weight.copy_(ref.in_proj_weight[D:])
            ours.kv_proj.bias.copy_(ref.in_proj_bias[D:])
        else:
            ours.qkv_proj.weight.copy_(ref.in_proj_weight)
            ours.qkv_proj.bias.copy_(ref.in_proj_bias)
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        ours.out_proj.bias.copy_(ref.out_proj.bias)


@pytest.mark.parametrize("kind", ["self", "cross"])
@pytest.mark.parametrize("masks", ["key_padding", "causal", "both"])
def test_multihead_matches_torch(kind, masks):
    torch.manual_seed(0)
    D, H, B, T, S = 16, 4, 3, 5, 7
    ref = torch.nn.MultiheadAttention(D, H, batch_first=True).eval()
    torch.nn.init.normal_(ref.in_proj_bias)  # non-zero biases
    torch.nn.init.normal_(ref.out_proj.bias)
    ours = (SelfAttention if kind == "self" else CrossAttention)(D, H).eval()
    copy_from_torch(ours, ref)
    x = torch.randn(B, T, D)
    kv = x if kind == "self" else torch.randn(B, S, D)
    Tk = kv.shape[1]
    valid = torch.ones(B, Tk, dtype=torch.bool)
    valid[1, Tk - 2 :] = False
    valid[2, Tk - 1 :] = False
    causal = causal_mask(torch.arange(T), torch.arange(Tk))
    use_pad, use_causal = masks in ("key_padding", "both"), masks in ("causal", "both")
    mask = None
    if use_pad:
        mask = padding_mask(valid)
    if use_causal:
        mask = causal if mask is None else mask & causal
    out, probs = with_weights(ours, x, mask=mask) if kind == "self" else with_weights(ours, x, kv, mask=mask)
    ref_out, ref_probs = ref(
        x,
        kv,
        kv,
        key_padding_mask=~valid if use_pad else None,
        attn_mask=~causal if use_causal else None,
        average_attn_weights=False,
    )
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(probs, ref_probs, atol=1e-5, rtol=0)  # per head, (B, H, T, Tk)


def test_self_attention_cache_appends_one_step_at_a_time():
    torch.manual_seed(0)
    mha = SelfAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)
    pos = torch.arange(6)
    full = mha(x, mask=causal_mask(pos, pos), positions=(pos, pos))
    cache = KVCache()
    for t in range(6):
        step = mha(x[:, t : t + 1], positions=(pos[t : t + 1], pos[: t + 1]), cache=cache)
        assert len(cache) == t + 1 and cache.k.shape == (2, 4, t + 1, 4)
        torch.testing.assert_close(step[:, 0], full[:, t], atol=1e-6, rtol=0)


def test_cross_attention_cache_projects_memory_once():
    torch.manual_seed(0)
    mha = CrossAttention(16, 4).eval()
    y, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    full = mha(y, memory=memory)
    cache = KVCache()
    calls = []
    mha.kv_proj.register_forward_hook(lambda *args: calls.append(1))
    steps = [mha(y[:, t : t + 1], memory=memory, cache=cache) for t in range(3)]
    assert len(calls) == 1
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-6, rtol=0)


def test_kv_cache_reorder_follows_index():
    cache = KVCache()
    k, v = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 4, 5), torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 4, 5)
    cache.append(k, v)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.k[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0] and cache.v[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]


def test_kv_cache_reorders_and_appends_like_indexing_a_concatenation():
    """Appends and reorders in turn (beam search), with growth past the capacity and a shrinking
    batch: the cache holds what indexing the concatenated keys would give, and it writes the
    reorders into a spare buffer, not into new memory every time."""
    torch.manual_seed(0)
    cache, reference_k, reference_v = KVCache(), None, None
    buffers = set()
    for step, rows in enumerate([4] * 12 + [3] * 12):
        index = torch.randint(0, reference_k.shape[0], (rows,)) if reference_k is not None else None
        if index is not None:
            cache.reorder(index)
            reference_k, reference_v = reference_k[index], reference_v[index]
        k, v = torch.randn(rows, 2, 1, 3), torch.randn(rows, 2, 1, 3)
        all_k, all_v = cache.append(k, v)
        reference_k = k if reference_k is None else torch.cat([reference_k, k], dim=2)
        reference_v = v if reference_v is None else torch.cat([reference_v, v], dim=2)
        assert torch.equal(all_k, reference_k) and torch.equal(all_v, reference_v), step
        buffers.add(cache.k.data_ptr())
    assert len(cache) == 24
    assert len(buffers) <= 6  # two buffers swap; new ones only on growth (16 -> 32) or a new batch size


def test_self_and_cross_attention_keep_their_parameters_names_and_order():
    """Checkpoints, goldens and the Hugging Face maps name these parameters; init_weights draws in
    their registration order (input projections, then W^O). Both are MultiHeadAttention."""
    self_attn, cross_attn = SelfAttention(16, 4), CrossAttention(16, 4)
    assert list(self_attn.state_dict()) == ["qkv_proj.weight", "qkv_proj.bias", "out_proj.weight", "out_proj.bias"]
    assert list(cross_attn.state_dict()) == [
        "q_proj.weight",
        "q_proj.bias",
        "kv_proj.weight",
        "kv_proj.bias",
        "out_proj.weight",
        "out_proj.bias",
    ]
    assert isinstance(self_attn, MultiHeadAttention) and isinstance(cross_attn, MultiHeadAttention)
