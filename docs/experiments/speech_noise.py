"""Speech recognition in noise (docs/results/audio.md, "Speech recognition in noise"): runs trained on
clean strings, scored on the same 1,000 validation strings with white noise added at each SNR
(`data.strings.snr_db`: the noise's power that many dB below the string's, drawn from each string's own
seed, so every run hears the same noise), by greedy search; the WER and CER of each (jiwer).

    .venv/bin/python docs/experiments/speech_noise.py RUN [RUN ...]
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, cast

from attnlab.decode.spec import Greedy
from attnlab.runs.checkpoint import load_run
from attnlab.runs.data import prepare
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.speech_recognition import SpeechData, transcript_record

SNRS: tuple[float | None, ...] = (None, 30.0, 20.0, 10.0, 5.0, 0.0)  # None: clean


def main(*runs: str) -> None:
    print("| run | " + " | ".join("clean" if s is None else f"{s:g} dB" for s in SNRS) + " |")
    print("|---|" + "---|" * len(SNRS))
    for run in runs:
        model, _, _ = load_run(run)
        _, data_cfg, train_cfg = RunDir(run).read_config()
        cells = []
        for snr in SNRS:
            noisy = dataclasses.replace(data_cfg, strings=dataclasses.replace(cast(Any, data_cfg).strings, snr_db=snr))
            data = cast(SpeechData, prepare(noisy, train_cfg, RunDir(run)))
            record = transcript_record(model, data, "valid", Greedy())
            cells.append(f"{record['wer']:.2%} ({record['cer']:.2%})")
        print(f"| {run} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:])
