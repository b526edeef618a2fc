"""The alignment figure of docs/results/audio.md ("Speech recognition"): four validation recordings of FSDD
(indices 5-9, never trained on) joined by 150 ms silences into one file, then `attnlab inspect` of a speech
recognition run on it (the spectrogram, every attention map, the cross-attention's alignment with time).

    .venv/bin/python docs/experiments/speech_alignment.py RUN OUT
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

RECORDINGS = ("3_jackson_5", "5_nicolas_6", "5_theo_7", "8_lucas_8")  # "3 5 5 8", each of the validation indices
RATE = 8000
GAP = np.zeros(int(0.15 * RATE), dtype=np.float32)


def main(run: str, out: str) -> None:
    pieces = []
    for name in RECORDINGS:
        sound, rate = sf.read(Path("data/fsdd/train") / f"{name}.wav", dtype="float32")
        assert rate == RATE, f"{name}: {rate} Hz"
        pieces += [sound, GAP]
    Path(out).mkdir(parents=True, exist_ok=True)
    wav = Path(out) / "3558.wav"
    sf.write(wav, np.concatenate(pieces[:-1]), RATE)
    figures = Path(out) / "inspect"
    subprocess.run(
        [sys.executable, "-m", "attnlab.cli", "inspect", run, "--src", str(wav), "--out", str(figures)], check=True
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
