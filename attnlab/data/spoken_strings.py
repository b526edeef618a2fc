"""Strings of spoken words made from recordings of single words (FSDD's digits): what a speech recogniser
learns from when only isolated words were recorded.

A string is drawn from a random generator: its number of words (uniform over a range), each word
(uniform over the words recorded), a recording of that word (uniform over its recordings), the silence
after each but the last (whole milliseconds, uniform from 0, zero included) and the seed of its noise.
A string longer than the limit is drawn again from the same generator. The waveform is the recordings
joined by their silences, plus, at ``snr_db``, white Gaussian noise of the string's mean power over
10^(snr_db / 10). Everything follows from the generator's seed, so a split of strings, or a training
batch, is the same on every machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnlab.errors import DataError

ATTEMPTS = 100  # draws of a string before its limit is judged too short for the recordings


@dataclass(frozen=True)
class SpokenString:
    """Which recordings (indices into a :class:`Recorded`), the silence after each but the last (samples),
    and the seed of the string's noise."""

    recordings: tuple[int, ...]
    gaps: tuple[int, ...]
    noise_seed: int


class Recorded:
    """One split's recordings, each of one word (``words``), as (T,) float32 ``sounds`` at ``rate`` Hz."""

    def __init__(self, sounds: list[np.ndarray], words: list[str], rate: int) -> None:
        self.sounds, self.words, self.rate = sounds, words, rate
        self.by_word = {w: [i for i, x in enumerate(words) if x == w] for w in sorted(set(words))}

    def draw(
        self, rng: np.random.Generator, n_words: tuple[int, int], max_gap_ms: int, max_samples: int, where: str
    ) -> SpokenString:
        """A string of ``n_words`` (least, most) words with gaps of 0 .. ``max_gap_ms`` ms, at most
        ``max_samples`` long; ``where`` names the recordings when no draw fits."""
        vocabulary = list(self.by_word)
        for _ in range(ATTEMPTS):
            n = int(rng.integers(n_words[0], n_words[1] + 1))
            words = rng.choice(len(vocabulary), size=n)
            recordings = tuple(int(rng.choice(self.by_word[vocabulary[w]])) for w in words)
            gaps = tuple(int(ms) * self.rate // 1000 for ms in rng.integers(0, max_gap_ms + 1, size=n - 1))
            string = SpokenString(recordings, gaps, int(rng.integers(2**31)))
            if self.samples(string) <= max_samples:
                return string
        raise DataError(
            f"{where}: {ATTEMPTS} strings of {n_words[0]}-{n_words[1]} recordings in a row were longer than "
            f"{max_samples / self.rate:g} s: raise strings.longest_seconds"
        )

    def samples(self, string: SpokenString) -> int:
        """The length of the string's waveform."""
        return sum(len(self.sounds[r]) for r in string.recordings) + sum(string.gaps)

    def transcript(self, string: SpokenString) -> str:
        """The words spoken, separated by spaces ("3 5 1")."""
        return " ".join(self.words[r] for r in string.recordings)

    def waveform(self, string: SpokenString, snr_db: float | None) -> np.ndarray:
        """(T,) float32: the recordings joined by their silences, with noise at ``snr_db`` (None: none)."""
        pieces = [self.sounds[string.recordings[0]]]
        for gap, r in zip(string.gaps, string.recordings[1:]):
            pieces += [np.zeros(gap, dtype=np.float32), self.sounds[r]]
        x = np.concatenate(pieces)
        if snr_db is None:
            return x
        power = float(np.mean(np.square(x, dtype=np.float64)))
        noise = np.random.default_rng(string.noise_seed).standard_normal(len(x))
        return (x + noise * math.sqrt(power / 10 ** (snr_db / 10))).astype(np.float32)
