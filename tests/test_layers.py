"""EncoderLayer, DecoderLayer (the decoder-only block) and Seq2SeqDecoderLayer against
torch.nn.TransformerEncoderLayer (causal for the decoder-only block) / TransformerDecoderLayer with
copied weights, and the residual + LayerNorm worked example."""

from __future__ import annotations

import pytest
import torch
from test_attention import copy_from_torch
from torch import nn

from attnlab.nn import (
    CrossAttention,
    DecoderLayer,
    EncoderLayer,
    KVCache,
    PositionWiseFeedForward,
    ResidualConnection,
    SelfAttention,
    Seq2SeqDecoderLayer,
    causal_mask,
    padding_mask,
)
from attnlab.nn.layers import EncoderOutput
from attnlab.nn.masks import AttentionMask

D, H, F_DIM = 16, 4, 32
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


def residual(norm):
    return ResidualConnection(D, 0.0, norm)


def copy_linear(ours: nn.Linear, ref: nn.Linear) -> None:
    ours.weight.data.copy_(ref.weight)
    ours.bias.data.copy_(ref.bias)


def copy_norm(ours: ResidualConnection, ref: nn.LayerNorm) -> None:
    ours.norm.weight.data.copy_(ref.weight)
    ours.norm.bias.data.copy_(ref.bias)


def randomise(module: nn.Module) -> None:
    """Non-trivial LayerNorm gains and biases everywhere, so that copying them is tested too."""
    torch.manual_seed(1)
    for m in module.modules():
        if isinstance(m, (nn.LayerNorm, nn.MultiheadAttention)):
            for p in m.parameters():
                if p.dim() == 1:
                    nn.init.normal_(p, mean=1.0 if isinstance(m, nn.LayerNorm) and p is m.weight else 0.0, std=0.3)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(norm_first, activation):
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(
        D, H, F_DIM, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    ).eval()
    randomise(ref)
    norm = "pre" if norm_first else "post"
    ours = EncoderLayer(
        SelfAttention(D, H),
        PositionWiseFeedForward(D, F_DIM, ACTIVATIONS[activation]()),
        residual(norm),
        residual(norm),
    ).eval()
    copy_from_torch(ours.self_attn, ref.self_attn)
    copy_linear(ours.feed_forward.w_1, ref.linear1)
    copy_linear(ours.feed_forward.w_2, ref.linear2)
    copy_norm(ours.self_attn_residual, ref.norm1)
    copy_norm(ours.feed_forward_residual, ref.norm2)

    x = torch.randn(3, 7, D)
    valid = torch.ones(3, 7, dtype=torch.bool)
    valid[1, 5:] = False
    pos = torch.arange(7)
    out = ours(x, padding_mask(valid), (pos, pos))
    ref_out = ref(x, src_key_padding_mask=~valid)
    # torch's fast path may return zeros at padded positions; compare the real ones
    torch.testing.assert_close(out[valid], ref_out[valid], atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_only_layer_matches_torch_causal_encoder_layer_and_its_cache(norm_first):
    """GPT's block is torch's encoder layer under a causal mask; fed one step at a time with a
    KVCache, it gives the same rows."""
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(D, H, F_DIM, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    randomise(ref)
    norm = "pre" if norm_first else "post"
    ours = DecoderLayer(
        SelfAttention(D, H), PositionWiseFeedForward(D, F_DIM, nn.ReLU()), residual(norm), residual(norm)
    ).eval()
    copy_from_torch(ours.self_attn, ref.self_attn)
    copy_linear(ours.feed_forward.w_1, ref.linear1)
    copy_linear(ours.feed_forward.w_2, ref.linear2)
    copy_norm(ours.self_attn_residual, ref.norm1)
    copy_norm(ours.feed_forward_residual, ref.norm2)

    y, pos = torch.randn(2, 5, D), torch.arange(5)
    out = ours(y, AttentionMask(causal=True), (pos, pos))
    ref_out = ref(y, src_mask=nn.Transformer.generate_square_subsequent_mask(5), is_causal=True)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=0)
    cache = KVCache()
    steps = [ours(y[:, t : t + 1], AttentionMask(causal=True), (pos[t : t + 1], pos[: t + 1]), cache) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), out, atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_seq2seq_decoder_layer_matches_torch(norm_first):
    torch.manual_seed(0)
    ref = nn.TransformerDecoderLayer(D, H, F_DIM, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    randomise(ref)
    norm = "pre" if norm_first else "post"
    ours = Seq2SeqDecoderLayer(
        SelfAttention(D, H),
        CrossAttention(D, H),
        PositionWiseFeedForward(D, F_DIM, nn.ReLU()),
        residual(norm),
        residual(norm),
        residual(norm),
    ).eval()
    copy_from_torch(ours.self_attn, ref.self_attn)
    copy_from_torch(ours.cross_attn, ref.multihead_attn)
    copy_linear(ours.feed_forward.w_1, ref.linear1)
    copy_linear(ours.feed_forward.w_2, ref.linear2)
    copy_norm(ours.self_attn_residual, ref.norm1)
    copy_norm(ours.cross_attn_residual, ref.norm2)
    copy_norm(ours.feed_forward_residual, ref.norm3)

    y, memory = torch.randn(3, 6, D), torch.randn(3, 8, D)
    tgt_valid, mem_valid = torch.ones(3, 6, dtype=torch.bool), torch.ones(3, 8, dtype=torch.bool)
    tgt_valid[2, 4:] = False
    mem_valid[0, 5:] = False
    pos = torch.arange(6)
    causal = causal_mask(pos, pos)
    source = EncoderOutput(memory, AttentionMask(key_valid=mem_valid), torch.arange(8))
    out = ours(y, causal & padding_mask(tgt_valid), (pos, pos), source)
    ref_out = ref(y, memory, tgt_mask=~causal, tgt_key_padding_mask=~tgt_valid, memory_key_padding_mask=~mem_valid)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=0)


def test_seq2seq_decoder_layer_registers_its_sublayers_in_the_order_they_compute():
    """Self-attention, cross-attention, FFN: the order of a checkpoint's keys and of init_weights' draws."""
    layer = Seq2SeqDecoderLayer(
        SelfAttention(D, H),
        CrossAttention(D, H),
        PositionWiseFeedForward(D, F_DIM, nn.ReLU()),
        residual("post"),
        residual("post"),
        residual("post"),
    )
    assert [name for name, _ in layer.named_children()] == [
        "self_attn",
        "self_attn_residual",
        "cross_attn",
        "cross_attn_residual",
        "feed_forward",
        "feed_forward_residual",
    ]


def test_residual_layer_norm_worked_example():
    """Seed 002: x = [0.2, 0.9, 0.4, 1.3], attention output [0.3, 0.7, 0.5, 1.1]; the sum
    [0.5, 1.6, 0.9, 2.4] has mean 1.35 and variance 0.5225, and post-norm returns (sum - 1.35) / sqrt(0.5225 + eps)."""
    block = ResidualConnection(4, dropout=0.0, placement="post", eps=1e-5)
    seen = []
    block.norm.register_forward_hook(lambda m, inputs, out: seen.append(inputs[0]))
    x = torch.tensor([[0.2, 0.9, 0.4, 1.3]])
    out = block(x, lambda h: torch.tensor([[0.3, 0.7, 0.5, 1.1]]))
    summed = seen[0]
    torch.testing.assert_close(summed, torch.tensor([[0.5, 1.6, 0.9, 2.4]]))
    torch.testing.assert_close(summed.mean(), torch.tensor(1.35))
    torch.testing.assert_close(summed.var(unbiased=False), torch.tensor(0.5225))
    expected = (torch.tensor([[0.5, 1.6, 0.9, 2.4]]) - 1.35) / (0.5225 + 1e-5) ** 0.5
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out, torch.tensor([[-1.1759, 0.3459, -0.6226, 1.4526]]), atol=1e-4, rtol=0)


def test_pre_norm_normalises_the_sublayer_input_only():
    block = ResidualConnection(4, dropout=0.0, placement="pre")
    x = torch.tensor([[0.5, 1.6, 0.9, 2.4]])
    out = block(x, lambda h: 2 * h)
    torch.testing.assert_close(out, x + 2 * nn.functional.layer_norm(x, (4,)))


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_a_residual_block_hands_its_sublayer_the_arguments_after_the_input(placement):
    """As a layer calls its attention: block(x, self_attn, mask, positions, cache), no closure between."""
    block = ResidualConnection(4, dropout=0.0, placement=placement)
    x, factor, shift = torch.tensor([[0.5, 1.6, 0.9, 2.4]]), torch.tensor(3.0), torch.tensor(-1.0)
    out = block(x, lambda h, a, b: a * h + b, factor, shift)
    norm = lambda h: nn.functional.layer_norm(h, (4,))
    expected = x + 3 * norm(x) - 1 if placement == "pre" else norm(x + 3 * x - 1)
    torch.testing.assert_close(out, expected)


def test_feed_forward_by_hand():
    ffn = PositionWiseFeedForward(2, 3, nn.ReLU())
    with torch.no_grad():
        ffn.w_1.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]))
        ffn.w_1.bias.zero_()
        ffn.w_2.weight.copy_(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 2.0]]))
        ffn.w_2.bias.copy_(torch.tensor([0.5, 0.0]))
    # x = [1, 3]: W1 x = [1, 3, -2] -> ReLU [1, 3, 0] -> W2 h + b = [4.5, 0]
    torch.testing.assert_close(ffn(torch.tensor([[[1.0, 3.0]]])), torch.tensor([[[4.5, 0.0]]]))
