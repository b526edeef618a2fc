"""Reading audio (attnlab/data/audio.py): each format written with soundfile and read back as numbers,
a 16-bit WAV written by Python's own `wave` module as the independent reference, stereo mixed to mono,
resampling by soxr against the tone sampled at the new rate, and each bad input as one line."""

from __future__ import annotations

import wave

import numpy as np
import pytest
import soundfile as sf

from attnlab.data.audio import audio_files, read_audio, resample
from attnlab.errors import DataError

RATE = 8000


def tone(freq: float = 440.0, seconds: float = 0.25, rate: int = RATE, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float64)


# (format, subtype, suffix, the largest error of a sample read back): PCM's quantisation step, float's rounding
FORMATS = [
    ("WAV", "PCM_U8", "wav", 2**-7),
    ("WAV", "PCM_16", "wav", 2**-15),
    ("WAV", "PCM_24", "wav", 2**-23),
    ("WAV", "PCM_32", "wav", 2**-24),
    ("WAV", "FLOAT", "wav", 2**-24),
    ("WAV", "DOUBLE", "wav", 2**-24),
    ("FLAC", "PCM_16", "flac", 2**-15),
    ("FLAC", "PCM_24", "flac", 2**-23),
]


@pytest.mark.parametrize("fmt, subtype, suffix, step", FORMATS)
def test_each_format_reads_back_its_samples(fmt, subtype, suffix, step, tmp_path):
    x = tone()
    path = tmp_path / f"a.{suffix}"
    sf.write(path, x, RATE, format=fmt, subtype=subtype)
    audio = read_audio(path)
    assert (audio.rate, audio.source_rate, audio.channels) == (RATE, RATE, 1)
    assert audio.samples.dtype == np.float32 and audio.samples.shape == x.shape and audio.seconds == 0.25
    error = np.abs(audio.samples - x).max()
    assert error <= step, (subtype, error)
    assert error > 0 or subtype in ("FLOAT", "DOUBLE", "PCM_32", "PCM_24")  # the coarse ones do quantise


def test_ogg_vorbis_reads_back_the_tone(tmp_path):
    """Vorbis is lossy: the tone comes back at its pitch and level, within 2% of its energy."""
    x = tone(seconds=1.0)
    sf.write(tmp_path / "a.ogg", x, RATE, format="OGG", subtype="VORBIS")
    y = read_audio(tmp_path / "a.ogg").samples.astype(np.float64)
    assert y.shape == x.shape
    assert np.sum((y - x) ** 2) / np.sum(x**2) < 0.02
    assert np.argmax(np.abs(np.fft.rfft(y))) == 440  # 1 Hz bins over one second


def test_a_16_bit_wav_from_the_wave_module_is_its_integers_over_32768(tmp_path):
    ints = np.array([0, 1, -1, 32767, -32768, 12345, -20000], dtype="<i2")
    with wave.open(str(tmp_path / "w.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(ints.tobytes())
    assert read_audio(tmp_path / "w.wav").samples.tolist() == (ints / 32768).astype(np.float32).tolist()


def test_stereo_is_mixed_to_mono_with_a_note(tmp_path):
    left, right = tone(440), tone(1000, amplitude=0.25)
    sf.write(tmp_path / "s.wav", np.stack([left, right], axis=1), RATE, subtype="FLOAT")
    notes: list[str] = []
    audio = read_audio(tmp_path / "s.wav", note=notes.append)
    assert audio.channels == 2
    np.testing.assert_allclose(audio.samples, ((left + right) / 2).astype(np.float32), atol=1e-7)
    assert notes == [f"{tmp_path / 's.wav'}: 2 channels mixed to mono (their mean)"]
    assert read_audio(tmp_path / "s.wav", rate=RATE).rate == RATE


@pytest.mark.parametrize("source, target", [(8000, 16000), (44100, 16000), (16000, 8000)])
def test_resampling_gives_the_tone_sampled_at_the_new_rate(source, target, tmp_path):
    """A 440 Hz tone at ``source`` Hz, resampled, equals the tone sampled at ``target`` Hz (away from the
    first and last 10 ms, where the filter meets the signal's edges); one note says so."""
    sf.write(tmp_path / "r.wav", tone(rate=source), source, subtype="FLOAT")
    notes: list[str] = []
    audio = read_audio(tmp_path / "r.wav", rate=target, note=notes.append)
    expected = tone(rate=target)
    assert audio.rate == target and audio.source_rate == source and audio.samples.shape == expected.shape
    edge = target // 100
    assert np.abs(audio.samples[edge:-edge] - expected[edge:-edge]).max() < 1e-3
    assert notes == [f"{tmp_path / 'r.wav'}: resampled from {source:,} Hz to {target:,} Hz (soxr HQ)"]
    same = expected.astype(np.float32)
    assert resample(same, target, target) is same  # the same rate: untouched


def test_resampling_removes_what_the_new_rate_cannot_hold():
    """3.5 kHz cannot exist at 6 kHz (Nyquist 3 kHz): soxr filters it out instead of folding it to 2.5 kHz."""
    y = resample(tone(3500, seconds=1.0, rate=16000).astype(np.float32), 16000, 6000)
    assert np.abs(y[60:-60]).max() < 1e-3


def _bytes_of(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_bad_inputs_are_one_line_each(tmp_path):
    sf.write(tmp_path / "good.wav", tone(), RATE, subtype="PCM_16")
    good = (tmp_path / "good.wav").read_bytes()
    nan = tone()
    nan[1000] = np.nan
    sf.write(tmp_path / "nan.wav", nan, RATE, subtype="FLOAT")
    inf = tone()
    inf[20] = np.inf
    sf.write(tmp_path / "inf.wav", inf, RATE, subtype="DOUBLE")
    sf.write(tmp_path / "zero.wav", np.zeros((0, 1)), RATE, subtype="PCM_16")
    cases = {
        _bytes_of(
            tmp_path, "text.wav", b"this is not audio\n" * 20
        ): "not an audio file that soundfile reads (WAV, FLAC, OGG, AIFF, ...): format not recognised",
        _bytes_of(
            tmp_path, "header.wav", good[:20]
        ): "damaged audio header (Error in WAV/W64/RF64 file. Malformed 'fmt ' chunk)",
        _bytes_of(
            tmp_path, "nodata.wav", good[:4] + b"XXXX" + good[8:12] + bytes(10) + good[22:]
        ): "damaged audio header (Error in WAV file. No 'data' chunk marker)",
        _bytes_of(tmp_path, "empty.wav", b""): "empty file (0 bytes), not audio",
        tmp_path / "zero.wav": "no samples (a 8000 Hz file of 0 frames)",
        tmp_path / "nan.wav": "NaN samples (1 frames, the first at frame 1,000, 0.125 s)",
        tmp_path / "inf.wav": "infinite samples (1 frames, the first at frame 20, 0.003 s)",
        tmp_path: "a folder, not an audio file",
        tmp_path / "missing.wav": "no such file",
    }
    for path, why in cases.items():
        with pytest.raises(DataError) as err:
            read_audio(path, rate=16000)
        assert str(err.value) == f"{path}: {why}", path


def test_a_folder_lists_its_audio_and_one_with_none_is_refused(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "notes.txt").write_text("not audio")
    with pytest.raises(DataError) as err:
        audio_files(tmp_path)
    assert (
        str(err.value)
        == f"{tmp_path}: no audio files (.wav, .flac, .ogg, .oga, .opus, .aiff, .aif) in it or its subfolders"
    )
    sf.write(tmp_path / "sub" / "b.FLAC", tone(), RATE, format="FLAC")
    sf.write(tmp_path / "a.wav", tone(), RATE)
    assert audio_files(tmp_path) == [tmp_path / "a.wav", tmp_path / "sub" / "b.FLAC"]
    with pytest.raises(DataError, match="a file, not a folder"):
        audio_files(tmp_path / "a.wav")
