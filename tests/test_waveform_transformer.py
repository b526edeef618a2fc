"""The raw waveform as tokens (issue 62, deliverable 2): ``arch: waveform_transformer``
(models/waveform_transformer.py, nn/waveform.py): decimation against scipy's resample_poly, the
clip normalisation against transformers' Wav2Vec2FeatureExtractor, the tokens of each stream by
hand, the padding rule and the config's refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.signal import resample_poly
from transformers import Wav2Vec2FeatureExtractor

from attnlab import ConfigError, build_model
from attnlab.nn.waveform import Decimation, normalised

from helpers import sized

RATE = 8000
SHAPE = dict(sample_rate=RATE, samples=4000, n_classes=3)
TINY = dict(
    arch="waveform_transformer",
    waveform=dict(frame_ms=10.0, streams=3, decimation=10),
    stack=dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0),
)


@pytest.mark.parametrize("factor", [2, 10, 100])
@pytest.mark.parametrize("length", [1003, 4000])
def test_decimation_is_scipys_resample_poly(factor, length):
    x = np.random.default_rng(factor).standard_normal((2, length))
    ours = Decimation(factor)(torch.from_numpy(x).float())
    assert ours.shape == (2, -(-length // factor))
    assert np.allclose(ours.numpy(), resample_poly(x, 1, factor, axis=1), atol=1e-5, rtol=0)


def test_decimation_removes_what_keeping_every_tenth_sample_folds_back():
    """A 1,000 Hz tone at 8 kHz, decimated by 10 (new Nyquist 400 Hz): every tenth sample keeps its
    whole power (aliased to 200 Hz); the filtered stream keeps under 0.1% of it, away from the ends."""
    t = torch.arange(8000) / RATE
    tone = torch.sin(2 * torch.pi * 1000.0 * t)[None]
    power = lambda x: float((x[:, 20:-20] ** 2).mean())  # noqa: E731
    assert power(tone[:, ::10]) == pytest.approx(0.5, rel=0.05)
    assert power(Decimation(10)(tone)) < 0.5e-3


def test_each_clip_is_normalised_as_wav2vec2s_feature_extractor_does():
    waves = torch.randn(3, 500) * torch.tensor([[0.1], [2.0], [0.5]]) + torch.tensor([[0.3], [-1.0], [0.0]])
    lengths = torch.tensor([500, 321, 7])
    mask = (torch.arange(500)[None] < lengths[:, None]).long().numpy()
    theirs = Wav2Vec2FeatureExtractor.zero_mean_unit_var_norm(list(waves.numpy()), attention_mask=mask)
    assert torch.allclose(normalised(waves, lengths), torch.from_numpy(np.stack(theirs)), atol=1e-5)


def test_the_tokens_of_each_stream_by_hand():
    """Three streams of 80-sample tokens (10 ms at 8 kHz) over 4,000 samples: 1 token at 1/100 of the
    rate (40 samples, zero-padded), 5 at 1/10, 50 at the full rate, coarse first; positions in frames of
    the finest stream; a token is its stream's linear map of its samples."""
    torch.manual_seed(0)
    model = build_model(*sized(**TINY, **SHAPE)).eval()
    waves, lengths = torch.randn(2, 4000), torch.tensor([4000, 1000])
    x, positions, valid = model.tokens(waves, lengths)
    assert x.shape == (2, 56, 16)
    assert positions.tolist() == [0, *range(0, 50, 10), *range(50)]
    assert valid.sum(1).tolist() == [1 + 5 + 50, 1 + 2 + 13]  # ceil(ceil(1000 / s) / 80)
    clip = normalised(waves, lengths)
    fine, medium = model.tokens.embeddings[2], model.tokens.embeddings[1]
    assert torch.allclose(x[:, 6 + 3], fine(clip[:, 240:320]), atol=1e-6)
    tenth = torch.from_numpy(resample_poly(clip.numpy().astype(np.float64), 1, 10, axis=1)).float()
    assert torch.allclose(x[:, 1 + 2], medium(tenth[:, 160:240]), atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_samples_past_a_clips_end_change_nothing(pooling):
    torch.manual_seed(0)
    model = build_model(*sized(**TINY, classifier=dict(pooling=pooling), **SHAPE)).eval()
    clip, noisy = torch.randn(1, 4000), torch.randn(1, 4000)
    noisy[:, :1500] = clip[:, :1500]
    with torch.no_grad():
        mine = torch.tensor([1500])
        assert torch.allclose(model.classify(clip, mine), model.classify(noisy, mine), atol=1e-6)
        alone = model.classify(clip[:, :1500], mine)
        assert torch.allclose(model.classify(clip, mine), alone, atol=1e-5)
        whole = torch.tensor([4000])
        assert not torch.allclose(model.classify(clip, whole), model.classify(noisy, whole), atol=1e-4)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(waveform=dict(frame_ms=0.1)), r"^waveform.frame_ms \(0.1\) is under 2 samples at 8,000 Hz"),
        (dict(waveform=dict(frame_ms=-1.0)), r"^waveform.frame_ms must be a positive number of milliseconds"),
        (dict(waveform=dict(streams=0)), r"^waveform.streams must be >= 1"),
        (dict(waveform=dict(decimation=1)), r"^waveform.decimation must be >= 2"),
        (
            dict(waveform=dict(decimations=2)),
            r"^unknown field 'decimations' in section 'model.waveform' \(did you mean 'decimation'\?\)$",
        ),
    ],
)
def test_the_config_refuses_in_one_line_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        sized(**{**TINY, **fields}, **SHAPE)
