"""The recordings the audio tasks read (audio classification, speech recognition): a folder of audio files
named as the Free Spoken Digit Dataset's, ``{digit}_{speaker}_{index}.wav`` (`attnlab data get fsdd`
writes its training recordings to data/fsdd/train/), and the part of a data section that says which
folder, which recordings are held out for validation and at what rate they are read (:class:`Recordings`,
written flat: ``data.recordings``, ``data.valid_first``, ...).

Validation: the recordings whose index is ``valid_first`` .. ``valid_last`` (5-9 by default: FSDD's
official test recordings, 0-4, are never in the training folder), so the split depends on the names
alone; or, with ``valid_speaker``, every recording of that speaker (the speaker-held-out protocol).
Each file is read by data/audio.py (soundfile), mixed to mono and resampled to ``sample_rate`` (soxr).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Optional

import numpy as np

from attnlab.config import TypedConfig, at_least
from attnlab.data.audio import audio_files, read_audio
from attnlab.errors import ConfigError, DataError

NAME = re.compile(r"^(?P<digit>\d+)_(?P<speaker>[^_]+)_(?P<index>\d+)$")  # FSDD: 7_jackson_32.wav


@dataclass(frozen=True)
class Recording:
    path: Path
    digit: str
    speaker: str
    index: int

    def label(self, field_name: str) -> str:
        return self.digit if field_name == "digit" else self.speaker


def recordings_in(folder: str | Path) -> list[Recording]:
    """The folder's audio files, each named ``{digit}_{speaker}_{index}``; another name is refused, naming it."""
    found = []
    for path in audio_files(folder):
        match = NAME.match(path.stem)
        if match is None:
            raise DataError(
                f"{path}: not named {{digit}}_{{speaker}}_{{index}} (as FSDD's 7_jackson_32.wav), so "
                f"its label is unknown"
            )
        found.append(Recording(path, str(int(match["digit"])), match["speaker"], int(match["index"])))
    return found


@dataclass(frozen=True)
class Recordings(TypedConfig):
    """``recordings``: a folder of ``{digit}_{speaker}_{index}`` audio files; the recordings of index
    ``valid_first`` .. ``valid_last`` are the validation split, or, with ``valid_speaker``, every
    recording of that speaker; each read at ``sample_rate`` Hz. Written in the data section itself
    (a task composes this part with config.flattened)."""

    section: ClassVar[str] = "data"

    recordings: Optional[str] = None
    valid_first: int = 5
    valid_last: int = 9
    valid_speaker: Optional[str] = None
    sample_rate: int = 8000

    def check(self) -> None:
        at_least("valid_first", self.valid_first, 0)
        at_least("valid_last", self.valid_last, self.valid_first)
        at_least("sample_rate", self.sample_rate, 1)
        by_index = (self.valid_first, self.valid_last) != (type(self).valid_first, type(self).valid_last)
        if self.valid_speaker is not None and by_index:  # an index range other than the default's
            raise ConfigError(
                f"valid_speaker ('{self.valid_speaker}') makes the validation split that speaker's recordings: "
                f"valid_first and valid_last choose by index instead; give one or the other"
            )

    def in_validation(self, recording: Recording) -> bool:
        """Whether ``recording`` is in the validation split (its speaker, or its index)."""
        if self.valid_speaker is not None:
            return recording.speaker == self.valid_speaker
        return self.valid_first <= recording.index <= self.valid_last

    def held_out(self) -> str:
        """The rule of the validation split, as the errors name it."""
        if self.valid_speaker is not None:
            return f"speaker '{self.valid_speaker}'"
        return f"indices {self.valid_first}-{self.valid_last}"

    def folder(self, task: str) -> str:
        """The folder of recordings, which a run that trains must give."""
        if self.recordings is None:
            raise ConfigError(
                f"data.task '{task}' needs 'recordings' (a folder of {{digit}}_{{speaker}}_{{index}}.wav files, "
                f"e.g. data/fsdd/train)"
            )
        return self.recordings

    def split(self, task: str) -> tuple[list[Recording], list[Recording]]:
        """The folder's recordings as (training, validation); a split left empty is refused in one line."""
        found = recordings_in(self.folder(task))
        held = [r for r in found if self.in_validation(r)]
        kept = [r for r in found if not self.in_validation(r)]
        for split, rows in (("training", kept), ("validation", held)):
            if not rows:
                speakers = (
                    f"; its speakers: {', '.join(sorted({r.speaker for r in found}))}" if self.valid_speaker else ""
                )
                raise DataError(f"{self.recordings}: no {split} recordings (validation: {self.held_out()}){speakers}")
        return kept, held


@dataclass
class Clips:
    """Waveforms (N, S) float32, zero-padded; their lengths (N,) in samples; (N,) True where a file was
    longer and cut."""

    waveforms: np.ndarray
    lengths: np.ndarray
    cut: np.ndarray


def read_clips(paths: list[Path], rate: int, samples: int, note: Callable[[str], None]) -> Clips:
    """Each file at ``rate`` Hz, cut or zero-padded to ``samples``."""
    waveforms = np.zeros((len(paths), samples), dtype=np.float32)
    lengths = np.zeros(len(paths), dtype=np.int64)
    cut = np.zeros(len(paths), dtype=bool)
    for row, path in enumerate(paths):
        sound = read_audio(path, rate, note).samples
        cut[row] = len(sound) > samples
        lengths[row] = min(len(sound), samples)
        waveforms[row, : lengths[row]] = sound[:samples]
    return Clips(waveforms, lengths, cut)


class Notes:
    """read_audio's one-line notes, the first said and the rest counted (a resampled folder)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, line: str) -> None:
        if self.count == 0:
            print(f"note: {line}", file=sys.stderr)
        self.count += 1

    def close(self) -> None:
        if self.count > 1:
            print(f"note: and {self.count - 1:,} more such notes", file=sys.stderr)
