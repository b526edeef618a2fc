"""An ast run and its `attnlab export-hf` folder, read by transformers, on the run's validation recordings
(docs/results/audio.md, "Whisper and the AST out to transformers"): attnlab's predicted classes against
those of transformers' ASTForAudioClassification on the folder's ASTFeatureExtractor features (each
recording as the run read it: at its rate, at most its clip), the accuracy of each, how many
predictions are the same, and the largest difference of the two models' logits.

    .venv/bin/attnlab export-hf RUN --out DIR
    .venv/bin/python docs/experiments/ast_export.py RUN DIR
"""

from __future__ import annotations

import sys
from typing import cast

import torch
import transformers

from attnlab.nn.interfaces import Classifier
from attnlab.runs.checkpoint import load_run
from attnlab.runs.data import read_run_data
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.audio_classification import AudioData


def main(run: str, folder: str) -> None:
    model, _, _ = load_run(run)
    model.eval()
    data = cast(AudioData, read_run_data(RunDir(run), "valid"))
    extractor = transformers.ASTFeatureExtractor.from_pretrained(folder)
    hf = transformers.ASTForAudioClassification.from_pretrained(folder).eval()
    ours, theirs, labels, gap = [], [], [], 0.0
    for batch in data.eval_batches("valid"):
        clips = [w[:n].numpy() for w, n in zip(batch.waveforms, batch.lengths.tolist())]  # each its own samples
        inputs = extractor(clips, sampling_rate=extractor.sampling_rate, return_tensors="pt").input_values
        with torch.no_grad():
            a = cast(Classifier, model).classify(batch.waveforms, batch.lengths)
            b = hf(input_values=inputs).logits
        gap = max(gap, (a - b).abs().max().item())
        ours += a.argmax(-1).tolist()
        theirs += b.argmax(-1).tolist()
        labels += batch.labels.tolist()
    n = len(labels)
    print(f"{n} validation recordings; the same class from both: {sum(x == y for x, y in zip(ours, theirs))}")
    print(f"attnlab:      accuracy {sum(x == y for x, y in zip(ours, labels)) / n:.2%}")
    print(f"transformers: accuracy {sum(x == y for x, y in zip(theirs, labels)) / n:.2%}")
    print(f"largest logit difference: {gap:.2e}")


if __name__ == "__main__":
    main(*sys.argv[1:])
