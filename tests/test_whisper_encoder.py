"""Spectrogram frames as tokens (issue 62, deliverable 2): ``arch: whisper_encoder``
(models/whisper_encoder.py, nn/audio.py's ConvStem and FrameTransformer) against transformers'
WhisperEncoder on the same weights, its padding rule, and its config's refusals."""

from __future__ import annotations

import pytest
import torch
from transformers import WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder, sinusoids

from attnlab import ConfigError, build_model
from attnlab.nn.positional import WhisperSinusoidalPositional

from helpers import sized

RATE = 8000
SHAPE = dict(sample_rate=RATE, samples=4000, n_classes=3)
TINY = dict(
    arch="whisper_encoder",
    features=dict(n_mels=8),
    stack=dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0),
)


@pytest.mark.parametrize("d_model, length", [(4, 3), (16, 50), (384, 1500)])
def test_the_sinusoids_are_whispers(d_model, length):
    ours = WhisperSinusoidalPositional(d_model).encode(torch.arange(length))
    assert torch.allclose(ours, sinusoids(length, d_model), atol=1e-5, rtol=0)


def load_whisper_encoder(model: torch.nn.Module, hf: WhisperEncoder) -> None:
    """attnlab's frames encoder given a WhisperEncoder's weights (its key projection has no bias:
    a zero one, which softmax cannot see anyway)."""
    stem = model.stem
    stem.conv1.load_state_dict(hf.conv1.state_dict())
    stem.conv2.load_state_dict(hf.conv2.state_dict())
    for ours, theirs in zip(model.encoder.layers, hf.layers):
        a = theirs.self_attn
        ours.self_attn.qkv_proj.weight.data = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        ours.self_attn.qkv_proj.bias.data = torch.cat([a.q_proj.bias, torch.zeros_like(a.q_proj.bias), a.v_proj.bias])
        ours.self_attn.out_proj.load_state_dict(a.out_proj.state_dict())
        ours.self_attn_residual.norm.load_state_dict(theirs.self_attn_layer_norm.state_dict())
        ours.feed_forward.w_1.load_state_dict(theirs.fc1.state_dict())
        ours.feed_forward.w_2.load_state_dict(theirs.fc2.state_dict())
        ours.feed_forward_residual.norm.load_state_dict(theirs.final_layer_norm.state_dict())
    model.encoder.norm.load_state_dict(hf.layer_norm.state_dict())


def test_the_encoder_is_whispers_on_the_same_weights():
    """Stem, sinusoids, pre-norm layers and final norm: the states of transformers' WhisperEncoder
    (randomly initialised, small) within 1e-5, over 12 frames (6 positions)."""
    torch.manual_seed(0)
    hf = WhisperEncoder(
        WhisperConfig(
            num_mel_bins=8,
            d_model=16,
            encoder_layers=2,
            encoder_attention_heads=2,
            encoder_ffn_dim=32,
            max_source_positions=6,
            activation_function="gelu",
        )
    ).eval()
    model = build_model(*sized(**TINY, **SHAPE)).eval()
    load_whisper_encoder(model, hf)
    features = torch.randn(2, 8, 12)  # (B, n_mels, frames), as WhisperEncoder takes them
    with torch.no_grad():
        theirs = hf(features).last_hidden_state  # (2, 6, 16)
        ours, valid = model.encode_frames(features.transpose(1, 2), torch.tensor([12, 12]))
    assert ours.shape == theirs.shape == (2, 6, 16) and bool(valid.all())
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_samples_past_a_clips_frames_change_nothing(pooling):
    """A clip's logits read its own frames only: noise after the window of its last frame changes
    nothing (the stem zeroes the frames past the end, the attention and the mean skip their tokens);
    read as a longer clip, the same noise changes them."""
    torch.manual_seed(0)
    model = build_model(*sized(**TINY, classifier=dict(pooling=pooling), **SHAPE)).eval()
    clip = torch.randn(1, 4000)
    clip[:, 1200:] = 0  # 1,200 samples: 15 frames of 10 ms at 8 kHz, 8 tokens
    noisy = clip.clone()
    noisy[:, 15 * 80 + 100 :] = torch.randn(1, 4000 - 15 * 80 - 100)  # past frame 14's 25 ms window
    with torch.no_grad():
        _, valid = model.encode(clip, torch.tensor([1200]))
        assert valid.sum().item() == 8 + (pooling == "cls")
        assert torch.allclose(model.classify(clip, torch.tensor([1200])), model.classify(noisy, torch.tensor([1200])))
        longer = torch.tensor([4000])
        assert not torch.allclose(model.classify(clip, longer), model.classify(noisy, longer), atol=1e-4)


def test_the_mean_is_over_each_clips_own_tokens():
    """Two clips in one batch: each one's logits are the head applied to the mean of its own valid
    states, computed here by hand from the states."""
    torch.manual_seed(1)
    model = build_model(*sized(**TINY, **SHAPE)).eval()
    waves, lengths = torch.randn(2, 4000), torch.tensor([4000, 1000])
    with torch.no_grad():
        states, valid = model.encode(waves, lengths)
        assert valid.sum(1).tolist() == [25, 6]  # ceil(50 / 2), ceil(12 / 2)
        pooled = torch.stack([states[0, :25].mean(0), states[1, :6].mean(0)])
        by_hand = pooled @ model.classifier.out.weight.T + model.classifier.out.bias
        assert torch.allclose(model.classify(waves, lengths), by_hand, atol=1e-6)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(stack=dict(d_model=15, n_heads=3)), r"^stack.d_model \(15\) must be even"),
        (dict(stack=dict(d_model=2, n_heads=1)), r"^stack.d_model must be >= 4"),
        (
            dict(stack=dict(d_model=16, n_heads=2, attention_backend="linear")),
            r"is blockwise or approximate, which a clip's few hundred tokens do not need",
        ),
        (dict(classifier=dict(pooling="max")), r"^classifier.pooling must be one of"),
    ],
)
def test_the_config_refuses_in_one_line_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        sized(**{**TINY, **fields}, **SHAPE)
