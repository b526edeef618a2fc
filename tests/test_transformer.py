"""Whole models: causality, permutation equivariance, padding, gradients, tying, initialisation, and
cached incremental decoding equal to full recomputation for every positional variant."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from attnlab import build_model
from attnlab.nn import EncoderDecoder, EncoderLayer, sinusoid
from attnlab.nn.registry import POSITIONAL

from helpers import assert_cached_matches_uncached, random_ids, sized, tiny_model, with_weights

VARIANTS = sorted(POSITIONAL)
NORMS = ["post", "pre"]


@pytest.mark.parametrize("positional,norm", list(itertools.product(VARIANTS, NORMS)))
def test_cached_decoding_equals_full_recomputation(positional, norm):
    lm = tiny_model(arch="decoder_lm", positions=dict(scheme=positional), norm=norm)
    tgt = random_ids(3, 9, generator_seed=1)
    tgt[2, 6:] = 0  # a padded row
    assert_cached_matches_uncached(lm, tgt)
    assert_cached_matches_uncached(lm, tgt, chunks=[4, 1, 3, 1])  # a prompt prefilled at once, then steps

    seq2seq = tiny_model(arch="encoder_decoder", positions=dict(scheme=positional), norm=norm)
    src = random_ids(3, 7, generator_seed=2)
    src[1, 3:] = 0
    assert_cached_matches_uncached(seq2seq, tgt, src=src)


@pytest.mark.parametrize("arch", ["decoder_lm", "encoder_decoder"])
@pytest.mark.parametrize("positional", VARIANTS)
def test_future_tokens_do_not_change_earlier_logits(arch, positional):
    model = tiny_model(arch=arch, positions=dict(scheme=positional))
    tgt = random_ids(2, 8)
    changed = tgt.clone()
    changed[:, 5:] = random_ids(2, 3, generator_seed=9)
    src = random_ids(2, 6, generator_seed=3)

    def run(y):
        return model(y) if arch == "decoder_lm" else model(src, y)

    before, after = run(tgt), run(changed)
    torch.testing.assert_close(after[:, :5], before[:, :5], atol=1e-6, rtol=0)
    assert not torch.allclose(after[:, 5:], before[:, 5:])


def test_encoder_layer_without_positions_is_permutation_equivariant():
    model = tiny_model(arch="encoder_only", positions=dict(scheme="none"))
    layer: EncoderLayer = model.encoder.layers[0]
    x = torch.randn(2, 7, 16)
    perm = torch.randperm(7)
    pos = torch.arange(7)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    torch.testing.assert_close(
        layer(x[:, perm], mask, (pos, pos)), layer(x, mask, (pos, pos))[:, perm], atol=1e-6, rtol=0
    )
    # and with positions it is not
    ids = random_ids(2, 7)
    positioned = tiny_model(arch="encoder_only", positions=dict(scheme="sinusoidal"))
    assert not torch.allclose(positioned.encode(ids[:, perm]), positioned.encode(ids)[:, perm], atol=1e-4)


@pytest.mark.parametrize("positional", VARIANTS)
def test_padding_changes_nothing_and_fully_padded_rows_stay_finite(positional):
    model = tiny_model(positions=dict(scheme=positional))
    src, tgt = random_ids(3, 6, generator_seed=4), random_ids(3, 5, generator_seed=5)
    logits = model(src, tgt)
    padded = model(F.pad(src, (0, 3)), tgt)  # three pad tokens after every source
    torch.testing.assert_close(padded, logits, atol=1e-5, rtol=0)
    src[1] = 0  # a source that is all padding
    tgt[2] = 0  # a target that is all padding
    model.train()
    out = model(src, tgt)
    out.logsumexp(-1).sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_lm", "encoder_only"])
@pytest.mark.parametrize("positional", VARIANTS)
def test_every_parameter_receives_a_gradient(arch, positional):
    model = tiny_model(arch=arch, positions=dict(scheme=positional), embeddings=dict(tie="none"), dropout=0.1).train()
    ids = random_ids(2, 6)
    targets = random_ids(2, 6, generator_seed=7)
    if arch == "encoder_decoder":
        loss = F.cross_entropy(model(random_ids(2, 5, generator_seed=8), ids).flatten(0, 1), targets.flatten())
    elif arch == "decoder_lm":
        loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
    else:
        loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten()) + F.cross_entropy(
            model.classify(ids), targets[:, 0] % 2
        )
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient for {missing}"


def test_beam_reorder_of_the_cache_matches_reordered_inputs():
    model = tiny_model()
    src, tgt = random_ids(3, 6, generator_seed=1), random_ids(3, 5, generator_seed=2)
    tgt[2, 1] = 0  # padding inside the cached steps of the row that moves: its mask must move too
    memory, src_valid = model.encode(src)
    cache = model.new_cache()
    with torch.no_grad():
        model.decode(tgt[:, :3], memory, src_valid, cache)
        index = torch.tensor([2, 0, 0])
        cache.reorder(index)
        # the cache holds the source keys and their mask: the arguments are not read again
        step = model.decode(tgt[:, 3:4], memory, src_valid, cache)
        full = model(src[index], torch.cat([tgt[index, :3], tgt[:, 3:4]], dim=1))
    torch.testing.assert_close(step[:, 0], full[:, 3], atol=1e-5, rtol=0)


def test_embeddings_are_scaled_tokens_plus_positions():
    model = tiny_model(arch="decoder_lm")
    ids = random_ids(2, 5)
    x = model.embed(ids, torch.arange(5))
    torch.testing.assert_close(x, model.embed.tokens.weight[ids] * 16**0.5 + sinusoid(torch.arange(5), 16))


def test_tying_options():
    shared = tiny_model(embeddings=dict(tie="all"))
    assert shared.src_embed.tokens.weight is shared.tgt_embed.tokens.weight is shared.generator.weight
    out_only = tiny_model(embeddings=dict(tie="output"), src_vocab_size=31)
    assert out_only.tgt_embed.tokens.weight is out_only.generator.weight
    assert out_only.src_embed.tokens.weight.shape == (31, 16)
    untied = tiny_model(embeddings=dict(tie="none"))
    assert (
        len({id(untied.src_embed.tokens.weight), id(untied.tgt_embed.tokens.weight), id(untied.generator.weight)}) == 3
    )
    lm = tiny_model(arch="decoder_lm", embeddings=dict(tie="all"))
    assert lm.embed.tokens.weight is lm.generator.weight
    bert = tiny_model(arch="encoder_only")
    assert bert.mlm_head.projection.weight is bert.embed.tokens.weight
    n_tied, n_untied = (sum(p.numel() for p in m.parameters()) for m in (shared, untied))
    assert n_untied - n_tied == 2 * 23 * 16


def test_concatenated_positions_fill_the_rest_of_d_model():
    model = tiny_model(arch="decoder_lm", positions=dict(combine="concat", dim=6), embeddings=dict(tie="none"))
    assert model.embed.tokens.embedding_dim == 10
    x = model.embed(random_ids(1, 4), torch.arange(4))
    torch.testing.assert_close(x[0, :, 10:], sinusoid(torch.arange(4), 6))
    assert model(random_ids(2, 4)).shape == (2, 4, 23)


def test_layer_counts_and_final_norm():
    model = tiny_model(depths=dict(encoder=3, decoder=1), norm="pre")
    assert len(model.encoder.layers) == 3 and len(model.decoder.layers) == 1
    assert isinstance(model.encoder.norm, torch.nn.LayerNorm)
    assert isinstance(tiny_model(norm="post").encoder.norm, torch.nn.Identity)


def test_initialisation_is_xavier_uniform_and_scaled_normal_embeddings():
    torch.manual_seed(0)
    model = build_model(*sized(vocab_size=1000, stack=dict(d_model=256, n_heads=4, n_layers=1, d_ff=1024)))
    w1 = model.encoder.layers[0].feed_forward.w_1.weight  # (1024, 256)
    bound = (6 / (256 + 1024)) ** 0.5
    assert w1.abs().max() <= bound and w1.abs().max() > 0.99 * bound
    torch.testing.assert_close(w1.std(), torch.tensor(bound / 3**0.5), rtol=0.02, atol=0)
    assert torch.count_nonzero(model.encoder.layers[0].feed_forward.w_1.bias) == 0
    emb = model.src_embed.tokens.weight
    torch.testing.assert_close(emb.std(), torch.tensor(256**-0.5), rtol=0.02, atol=0)


def test_encoder_only_heads():
    model = tiny_model(arch="encoder_only", n_classes=3)
    ids = random_ids(2, 6)
    h = model.encode(ids)
    torch.testing.assert_close(model(ids), model.mlm_head(h))
    head = model.classifier
    torch.testing.assert_close(model.classify(ids), head.out(torch.tanh(head.pool(h[:, 0]))))
    assert model.classify(ids).shape == (2, 3)


def test_models_read_pad_id_from_the_data_shape():
    model = tiny_model(pad_id=5)
    assert isinstance(model, EncoderDecoder) and model.pad_id == 5
    src = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(model(torch.tensor([[1, 2, 3, 5, 5]]), src), model(src, src), atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["decoder_lm", "encoder_only"])
def test_single_stack_models_stay_finite_on_padding_rows(arch):
    model = tiny_model(arch=arch).train()
    ids = random_ids(3, 6)
    ids[1] = 0
    out = model(ids) if arch == "decoder_lm" else model(ids) + model.classify(ids).sum()
    out.logsumexp(-1).sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("site", ["embeddings", "attention", "residual"])
def test_dropout_sits_where_the_paper_puts_it(site):
    """Only the configured site's dropout changes the output: embeddings (sum of token vectors and
    positions), attention weights, and each sublayer's output before the residual sum."""
    base = dict(arch="decoder_lm", stack=dict(dropout=0.0, attention_dropout=0.0))
    model = tiny_model(**base).train()
    ids = random_ids(2, 6)
    torch.manual_seed(3)
    clean = model(ids)
    modules = {
        "embeddings": [model.embed.dropout],
        "residual": [m.dropout for m in model.modules() if type(m).__name__ == "ResidualConnection"],
    }
    if site == "attention":
        attns = [m for m in model.modules() if type(m).__name__ == "SelfAttention"]
        for m in attns:
            m.dropout_p = 0.5
        x = torch.randn(2, 6, 16)
        _, weights = with_weights(attns[0], x)  # (B, H, T, T) as applied: some dropped, the rest x2
        assert (weights == 0).any() and not torch.allclose(weights.sum(-1), torch.ones(2, 4, 6))
    else:
        for m in modules[site]:
            m.p = 0.5
    noisy = model(ids)
    assert not torch.allclose(noisy, clean)
    model.eval()
    torch.testing.assert_close(model(ids), clean)  # eval mode: no dropout anywhere


def test_fused_projections_are_initialised_block_by_block():
    torch.manual_seed(0)
    model = build_model(*sized(vocab_size=100, stack=dict(d_model=512, n_heads=8, n_layers=1, d_ff=64)))
    bound = (6 / (512 + 512)) ** 0.5  # Xavier for one d_model x d_model matrix
    for fused in (model.encoder.layers[0].self_attn.qkv_proj, model.decoder.layers[0].cross_attn.kv_proj):
        for block in fused.weight.split(512):
            torch.testing.assert_close(block.std(), torch.tensor(bound / 3**0.5), rtol=0.02, atol=0)


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_lm", "rnn"])
def test_last_only_projects_just_the_last_position(arch):
    model = tiny_model(arch=arch)
    src, tgt = random_ids(2, 7), random_ids(2, 5, generator_seed=1)
    if arch == "decoder_lm":
        full, last = model(tgt), model(tgt, last_only=True)
    else:
        memory, valid = model.encode(src)
        full, last = model.decode(tgt, memory, valid), model.decode(tgt, memory, valid, last_only=True)
    assert last.shape == (2, 1, 23)
    torch.testing.assert_close(last, full[:, -1:])


def test_a_decoder_given_memory_without_its_validity_attends_to_all_of_it():
    """memory_valid=None means every memory position is real: the same as an all-True mask."""
    model = tiny_model(arch="encoder_decoder")
    src, tgt = random_ids(2, 5), random_ids(2, 4, generator_seed=1)
    memory, src_valid = model.encode(src)
    positions = model.tgt_embed.positions(0, tgt.shape[1], tgt.device)
    y = model.tgt_embed(tgt, positions)
    assert src_valid.all()
    torch.testing.assert_close(
        model.decoder(y, tgt != 0, positions, memory, None),
        model.decoder(y, tgt != 0, positions, memory, src_valid),
        atol=0,
        rtol=0,
    )


class SDPACalls:
    """F.scaled_dot_product_attention as the sdpa backend calls it, each call's mask arguments kept."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[dict] = []
        real = F.scaled_dot_product_attention

        def recorded(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
            self.calls.append({"attn_mask": attn_mask, "is_causal": is_causal, "square": q.shape[2] == k.shape[2]})
            return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

        monkeypatch.setattr("attnlab.nn.kernels.F.scaled_dot_product_attention", recorded)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rotary"])
def test_a_gpt_batch_reaches_sdpa_causal_without_a_mask_tensor_padded_or_not(monkeypatch, positional):
    """The fused kernels' fast path: ``is_causal=True`` and no (B, 1, T, T) mask, in every layer,
    for an unpadded batch and for a right-padded one (causality already hides padding keys from
    every real query), with the same logits at the real positions as the padded row alone."""
    lm = tiny_model(arch="decoder_lm", positions=dict(scheme=positional), attention_backend="sdpa")
    calls = SDPACalls(monkeypatch)
    ids = random_ids(3, 9, generator_seed=1)
    with torch.no_grad():
        unpadded = lm(ids)
        ids[2, 6:] = 0  # right padding
        padded = lm(ids)
        alone = lm(ids[2:, :6])
    assert len(calls.calls) == 3 * 2  # three passes, 2 layers
    assert all(c["is_causal"] and c["attn_mask"] is None for c in calls.calls)
    torch.testing.assert_close(padded[:2], unpadded[:2])
    torch.testing.assert_close(padded[2:, :6], alone, atol=1e-5, rtol=0)


def test_an_encoder_decoder_builds_its_padding_masks_once_per_stack(monkeypatch):
    """Decoder self-attention: causal, no mask tensor; the encoder's and the cross-attention's
    padding: one additive mask each, shared by every layer of the stack (the same tensor)."""
    model = tiny_model(positions=dict(scheme="sinusoidal"), attention_backend="sdpa")
    calls = SDPACalls(monkeypatch)
    src, tgt = random_ids(3, 7, generator_seed=2), random_ids(3, 5, generator_seed=3)
    src[1, 3:] = 0
    with torch.no_grad():
        model(src, tgt)
    encoder, decoder = calls.calls[:2], calls.calls[2:]
    assert all(c["attn_mask"] is not None and not c["is_causal"] for c in encoder)
    assert encoder[0]["attn_mask"] is encoder[1]["attn_mask"]
    self_attn, cross_attn = decoder[0::2], decoder[1::2]
    assert all(c["is_causal"] and c["attn_mask"] is None for c in self_attn)
    assert cross_attn[0]["attn_mask"] is cross_attn[1]["attn_mask"] is not None


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_lm", "encoder_only"])
def test_a_vocabulary_padded_to_64_changes_no_logit_loss_or_gradient(arch):
    """embeddings.vocab_multiple 64: the token table and the tied output projection get rows up to 64 (23 -> 64),
    whatever they hold; the logits keep V columns, and the loss and every gradient equal the
    unpadded model's, the padding rows' gradient zero."""
    plain = tiny_model(arch=arch).train()
    padded = tiny_model(arch=arch, embeddings=dict(vocab_multiple=64)).train()
    with torch.no_grad():
        for name, p in padded.named_parameters():
            p.normal_()  # padding rows: anything
            p[tuple(slice(0, n) for n in dict(plain.named_parameters())[name].shape)] = dict(plain.named_parameters())[
                name
            ]
    src, tgt = random_ids(3, 7, generator_seed=2), random_ids(3, 6, generator_seed=3)
    src[1, 4:] = 0
    outputs = [model(src, tgt) if arch == "encoder_decoder" else model(tgt) for model in (plain, padded)]
    assert outputs[1].shape == outputs[0].shape == (3, 6, 23)
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-6, rtol=0)
    targets = random_ids(3, 6, generator_seed=4)
    losses = [F.cross_entropy(out.flatten(0, 1), targets.flatten(), label_smoothing=0.1) for out in outputs]
    torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=0)
    for loss in losses:
        loss.backward()
    grads = dict(padded.named_parameters())
    for name, p in plain.named_parameters():
        grad = grads[name].grad
        if p.grad is None:  # the encoder's classifier: not in this loss
            assert grad is None, name
            continue
        real = tuple(slice(0, n) for n in p.shape)
        torch.testing.assert_close(grad[real], p.grad, atol=1e-6, rtol=0, msg=name)
        assert grad.abs().sum() == grad[real].abs().sum(), f"{name}: the padding rows got a gradient"
