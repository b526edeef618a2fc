"""Audio as data: sound files read through soundfile (libsndfile: WAV at PCM 8/16/24/32-bit or float,
FLAC, OGG Vorbis / Opus, and the other formats it knows), mixed to mono and resampled to a run's rate
through soxr (libsoxr).

Why soxr rather than scipy's ``resample_poly``: it takes any pair of rates as they are (44,100 ->
16,000 needs no up/down factors of 160/441 and no filter designed for them), its "HQ" quality is a
linear-phase filter with a stop band past 140 dB down (librosa's default resampler is the same
library), and it runs in C on the whole signal at once. The one-line notes say what was done to a
file (channels mixed, rate changed), and every bad input is one :class:`~attnlab.errors.DataError`
line naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np
import soundfile as sf
import soxr
import torch

from attnlab.data.sources import no_such_file
from attnlab.errors import DataError

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".opus", ".aiff", ".aif")  # what audio_files lists
RESAMPLER = "soxr HQ"  # the quality the notes name


@dataclass(frozen=True)
class Audio:
    """One file's sound: ``samples`` (T,) float32, mono, in [-1, 1] for PCM; ``rate`` in Hz;
    ``source_rate`` and ``channels``, the file's own."""

    samples: np.ndarray
    rate: int
    source_rate: int
    channels: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate


def read_audio(path: str | Path, rate: int | None = None, note: Callable[[str], None] = lambda line: None) -> Audio:
    """The sound of the file ``path``, mixed to mono (the mean of its channels) and, when ``rate`` is
    given and differs, resampled to it; each of the two is said in one ``note`` line. Not audio, a
    damaged header, an empty file or one of no samples, and NaN or infinite samples are DataErrors."""
    path = Path(path)
    if not path.exists():
        raise no_such_file(path)
    if path.is_dir():
        raise DataError(f"{path}: a folder, not an audio file")
    if path.stat().st_size == 0:
        raise DataError(f"{path}: empty file (0 bytes), not audio")
    return decode_audio(path, str(path), rate, note)


def decode_audio(
    source: Path | BinaryIO, name: str, rate: int | None = None, note: Callable[[str], None] = lambda line: None
) -> Audio:
    """:func:`read_audio`'s reading of a file or of bytes (an upload), every message naming ``name``."""
    try:
        data, source_rate = sf.read(source, dtype="float32", always_2d=True)  # (T, channels); PCM scaled to [-1, 1)
    except sf.LibsndfileError as err:
        raise DataError(f"{name}: {_why(err)}") from None
    except (RuntimeError, ValueError, OSError) as err:  # a chunk that lies about its size, a read cut short
        raise DataError(f"{name}: damaged audio file ({err})") from None
    frames, channels = data.shape
    if frames == 0:
        raise DataError(f"{name}: no samples (a {source_rate} Hz file of 0 frames)")
    bad = ~np.isfinite(data).all(axis=1)
    if bad.any():
        first = int(np.argmax(bad))
        kind = "NaN" if np.isnan(data[first]).any() else "infinite"
        raise DataError(
            f"{name}: {kind} samples ({int(bad.sum()):,} frames, the first at frame {first:,}, "
            f"{first / source_rate:.3f} s)"
        )
    samples = data[:, 0] if channels == 1 else data.mean(axis=1, dtype=np.float32)
    if channels > 1:
        note(f"{name}: {channels} channels mixed to mono (their mean)")
    if rate is not None and rate != source_rate:
        samples = resample(samples, source_rate, rate)
        note(f"{name}: resampled from {source_rate:,} Hz to {rate:,} Hz ({RESAMPLER})")
    return Audio(np.ascontiguousarray(samples, dtype=np.float32), rate or source_rate, source_rate, channels)


def resample(samples: np.ndarray, source_rate: int, rate: int) -> np.ndarray:
    """``samples`` (T,) at ``source_rate`` Hz as (round(T rate / source_rate),) at ``rate`` Hz, through
    soxr at HQ quality (linear phase: no delay to undo)."""
    if source_rate <= 0 or rate <= 0:
        raise ValueError(f"sample rates must be positive (got {source_rate} -> {rate})")
    if source_rate == rate:
        return samples
    resampled: np.ndarray = soxr.resample(np.asarray(samples, dtype=np.float32), source_rate, rate, quality="HQ")
    return resampled


def audio_files(folder: str | Path) -> list[Path]:
    """The audio files in ``folder`` and its subfolders (by suffix), sorted; a folder with none is a
    DataError naming the suffixes looked for."""
    folder = Path(folder)
    if not folder.is_dir():
        raise no_such_file(folder) if not folder.exists() else DataError(f"{folder}: a file, not a folder")
    found = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)
    if not found:
        raise DataError(f"{folder}: no audio files ({', '.join(AUDIO_SUFFIXES)}) in it or its subfolders")
    return found


def _why(err: sf.LibsndfileError) -> str:
    """libsndfile's reason, in the words the user needs."""
    reason = err.error_string.strip().rstrip(".")
    if "Format not recognised" in reason:
        return "not an audio file that soundfile reads (WAV, FLAC, OGG, AIFF, ...): format not recognised"
    return f"damaged audio header ({reason})"


def zero_padded(sounds: list[np.ndarray]) -> torch.Tensor:
    """(B, S) float32: the (T_b,) sounds one a row, zero-padded to the longest."""
    waves = torch.zeros(len(sounds), max(map(len, sounds)))
    for row, sound in enumerate(sounds):
        waves[row, : len(sound)] = torch.from_numpy(sound)
    return waves
