"""Log-mel features and SpecAugment (attnlab/nn/spectrogram.py): the mel bank against transformers'
``mel_filter_bank`` (Whisper's and AST's settings and the other combinations) within 1e-6, the log-mel
against WhisperFeatureExtractor on the same 16 kHz waveform within 1e-4, and the masks' counts and
widths against SpecAugment's parameters, reproducible from a seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.nn.spectrogram import KaldiFbank, LogMel, SpecAugment, hertz_to_mel, mel_filter_bank, mel_to_hertz

audio_utils = pytest.importorskip("transformers.audio_utils")


@pytest.mark.filterwarnings("ignore:At least one mel filter has all zero values")  # AST's 128 bands, as AST has them
@pytest.mark.parametrize(
    "n_freqs, n_mels, f_min, f_max, rate, norm, scale, triangles",
    [
        (201, 80, 0.0, 8000.0, 16000, "slaney", "slaney", "hertz"),  # Whisper
        (201, 128, 0.0, 8000.0, 16000, "slaney", "slaney", "hertz"),  # Whisper large-v3
        (257, 128, 20.0, 8000.0, 16000, None, "kaldi", "mel"),  # AST
        (201, 40, 0.0, 4000.0, 8000, None, "htk", "hertz"),  # torchaudio's default, at FSDD's rate
        (201, 40, 0.0, 4000.0, 8000, "slaney", "htk", "hertz"),
        (257, 64, 125.0, 7500.0, 16000, None, "slaney", "hertz"),
        (129, 23, 30.0, 4000.0, 8000, "slaney", "kaldi", "mel"),
    ],
)
def test_mel_bank_equals_transformers(n_freqs, n_mels, f_min, f_max, rate, norm, scale, triangles):
    ours = mel_filter_bank(n_freqs, n_mels, f_min, f_max, rate, norm, scale, triangles)
    theirs = audio_utils.mel_filter_bank(
        n_freqs, n_mels, f_min, f_max, rate, norm=norm, mel_scale=scale, triangularize_in_mel_space=triangles == "mel"
    )
    assert ours.shape == theirs.shape == (n_freqs, n_mels)
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=0, atol=1e-6)
    assert ours.max() > 0.01 and (ours >= 0).all()


@pytest.mark.parametrize("scale", ["htk", "kaldi", "slaney"])
def test_mel_scales_match_and_invert(scale):
    hz = torch.tensor([0.0, 100.0, 999.0, 1000.0, 1001.0, 4000.0, 8000.0], dtype=torch.float64)
    np.testing.assert_allclose(hertz_to_mel(hz, scale).numpy(), audio_utils.hertz_to_mel(hz.numpy(), scale), atol=1e-9)
    np.testing.assert_allclose(mel_to_hertz(hertz_to_mel(hz, scale), scale).numpy(), hz.numpy(), atol=1e-7)


def speech_like(seconds: float, rate: int = 16000, seed: int = 0) -> np.ndarray:
    """Harmonics with a moving pitch and noise: a waveform with energy across the mel bands."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    pitch = 120 + 40 * np.sin(2 * np.pi * 1.5 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 20)) * 0.1 + 0.01 * rng.standard_normal(t.shape)
    return x.astype(np.float32)


def test_log_mel_equals_whisper_feature_extractor():
    """The same 16 kHz waveform, padded to Whisper's 30 s: (80 bands x 3,000 frames) within 1e-4."""
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor()  # 80 bands, n_fft 400, hop 160, 16 kHz, 30 s chunks
    x = speech_like(2.3)
    theirs = extractor(x, sampling_rate=16000, return_tensors="np").input_features[0]  # (80, 3000)
    padded = torch.zeros(30 * 16000)
    padded[: len(x)] = torch.from_numpy(x)
    ours = LogMel()(padded)  # (3000, 80)
    assert ours.shape == (3000, 80) and theirs.shape == (80, 3000)
    np.testing.assert_allclose(ours.T.numpy(), theirs, rtol=0, atol=1e-4)
    assert theirs.max() - theirs.min() > 1.5  # the 80 dB floor and the signal both present
    # With torch installed the extractor runs torch.stft as we do; its NumPy path (transformers' own
    # float64 STFT, the one it takes without torch) is the independent reference: within 1e-4 too.
    numpy_path = extractor._np_extract_fbank_features(padded.double().numpy()[None], "cpu")[0]
    np.testing.assert_allclose(ours.T.numpy(), numpy_path, rtol=0, atol=1e-4)


def test_kaldi_fbank_equals_ast_feature_extractor():
    """AST's features: the extractor's Kaldi fbank (its NumPy path: torchaudio is not installed here) of
    two 16 kHz clips of exactly 98 frames (no padding to compare), standardised by its AudioSet mean and
    std, (x - mean) / (2 std): KaldiFbank's through the model's offset and scale, within 1e-4 (7.0e-6
    here). The raw log-fbank differs most in the quietest bands, where a power near Kaldi's floor of
    1.2e-7 meets float32's rounding: 6.4e-5 here, at a value of -15.77 (4.7e-4 on a noisy tone)."""
    from transformers import ASTFeatureExtractor

    from attnlab.models.audio import LogMelFeatures, SpecAugmentation
    from attnlab.models.audio import spectrogram as build_spectrogram
    from attnlab.models.shape import DataShape

    extractor = ASTFeatureExtractor(max_length=98)  # 128 bands, 25 ms windows every 10 ms, 16 kHz
    clips = [speech_like(0.995, seed=3), 0.2 * speech_like(0.995, seed=4)]  # 15,920 samples: 1 + 15,520 / 160 frames
    theirs = extractor(clips, sampling_rate=16000, return_tensors="np").input_values  # (2, 98, 128)
    features = LogMelFeatures(
        n_mels=128, filterbank="kaldi", scaling="log", offset=extractor.mean, scale=2 * extractor.std
    )
    shape = DataShape(sample_rate=16000, samples=len(clips[0]))
    assert features.frames(shape) == 98
    spectrogram = build_spectrogram(features, SpecAugmentation(), shape, "the test")
    ours = spectrogram.features(torch.from_numpy(np.stack(clips)))  # (2, 98, 128)
    assert ours.shape == theirs.shape == (2, 98, 128)
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=0, atol=1e-4)
    raw = KaldiFbank()(torch.from_numpy(clips[0])).numpy()
    np.testing.assert_allclose(raw, extractor._extract_fbank_features(clips[0], 98), rtol=0, atol=1e-3)  # see above


def test_log_mel_batched_per_example_and_natural_log():
    """Each example's floor is its own maximum's; a batch equals its rows one at a time; the 'log'
    scaling is ln of the mel power that the Whisper scaling takes log10 of."""
    x = torch.from_numpy(np.stack([speech_like(1.0, seed=1), 0.01 * speech_like(1.0, seed=2)]))
    logmel = LogMel()
    batch = logmel(x)
    assert batch.shape == (2, logmel.frames(16000), 80) == (2, 100, 80)
    for row in range(2):
        torch.testing.assert_close(batch[row], logmel(x[row]), rtol=0, atol=1e-6)
    assert batch[0].max() > batch[1].max() + 0.9  # 40 dB quieter: log10 down by 4, over 4
    natural = LogMel(scaling="log", n_mels=40, rate=8000, n_fft=200, hop=80, norm=None, scale="htk")(x[0])
    assert natural.shape == (200, 40)
    spectrum = torch.stft(x[0], 200, 80, window=torch.hann_window(200), return_complex=True)[:, :-1].abs() ** 2
    bank = torch.from_numpy(audio_utils.mel_filter_bank(101, 40, 0.0, 4000.0, 8000)).float()
    torch.testing.assert_close(natural, (spectrum.T @ bank).clamp(min=1e-10).log(), rtol=1e-5, atol=1e-4)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="mel scale 'mels' is not one of 'htk', 'kaldi', 'slaney'"):
        mel_filter_bank(201, 80, 0, 8000, 16000, scale="mels")
    with pytest.raises(ValueError, match="norm 'area'"):
        mel_filter_bank(201, 80, 0, 8000, 16000, norm="area")
    with pytest.raises(ValueError, match=r"hop \(500\) must be in 1 .. n_fft \(400\)"):
        LogMel(hop=500)
    with pytest.raises(ValueError, match=r"time_ratio \(1.5\)"):
        SpecAugment(time_ratio=1.5)


def test_spec_augment_masks_follow_the_parameters():
    """Over 400 examples: exactly freq_masks bands and time_masks spans each; every width within its
    bound (time: min(time_width, floor(time_ratio x length))) and every span inside the example; the
    widths cover 0 .. the bound with mean near half of it; the masked cells are exactly the spans'."""
    aug = SpecAugment(freq_masks=2, freq_width=7, time_masks=3, time_width=20, time_ratio=0.2, value=-1.0).train()
    b, t, f = 400, 120, 40
    lengths = torch.randint(30, t + 1, (b,), generator=torch.Generator().manual_seed(0))
    time, freq = aug.spans(b, t, f, lengths, torch.Generator().manual_seed(1))
    assert time.shape == (b, 3, 2) and freq.shape == (b, 2, 2)
    bound = torch.clamp(torch.floor(0.2 * lengths).long(), max=20)
    assert ((time[..., 1] >= 0) & (time[..., 1] <= bound[:, None])).all()
    assert ((time[..., 0] >= 0) & (time[..., 0] + time[..., 1] <= lengths[:, None])).all()
    assert ((freq[..., 1] >= 0) & (freq[..., 1] <= 7) & (freq[..., 0] + freq[..., 1] <= f)).all()
    assert set(freq[..., 1].flatten().tolist()) == set(range(8))
    assert abs(freq[..., 1].float().mean().item() - 3.5) < 0.3
    full = time[lengths >= 100][..., 1]  # the examples whose bound is time_width, 20
    assert full.max() == 20 and full.min() == 0 and abs(full.float().mean().item() - 10) < 1.5

    x = torch.randn(b, t, f)
    y = aug(x, lengths, torch.Generator().manual_seed(1))  # the same seed: the same spans
    expected = np.zeros((b, t, f), dtype=bool)
    for i in range(b):
        for start, width in time[i].tolist():
            expected[i, start : start + width, :] = True
        for start, width in freq[i].tolist():
            expected[i, :, start : start + width] = True
    masked = torch.from_numpy(expected)
    assert torch.equal(y[masked], torch.full((int(masked.sum()),), -1.0)) and torch.equal(y[~masked], x[~masked])
    assert 0 < masked.float().mean() < 0.5


def test_spec_augment_is_deterministic_and_only_in_training():
    aug = SpecAugment(freq_masks=1, freq_width=10, time_masks=2, time_width=15)
    x = torch.randn(4, 50, 20)
    a = aug(x, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, aug(x, generator=torch.Generator().manual_seed(7)))
    assert not torch.equal(a, aug(x, generator=torch.Generator().manual_seed(8)))
    assert torch.equal(aug.eval()(x, generator=torch.Generator().manual_seed(7)), x)
    assert torch.equal(SpecAugment(freq_masks=0, time_masks=0).train()(x), x)
