"""A whisper run and its `attnlab export-hf` folder, read by transformers, on the run's validation strings
(docs/results/audio.md, "Whisper out"): attnlab's greedy transcripts against those of transformers'
WhisperForConditionalGeneration.generate on the folder's WhisperFeatureExtractor features, their word error
rates (jiwer), how many transcripts are the same, and the largest difference of the two models' logits
on the first batch of references (teacher-forced).

    .venv/bin/attnlab export-hf RUN --out DIR
    .venv/bin/python docs/experiments/whisper_export.py RUN DIR
"""

from __future__ import annotations

import sys
from typing import cast

import torch
import transformers

from attnlab.data.tokenizers import Tokenizer
from attnlab.decode.search import greedy
from attnlab.eval.metrics import error_rates
from attnlab.runs.checkpoint import load_run
from attnlab.runs.data import read_run_data
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.speech_recognition import SpeechData


def main(run: str, folder: str) -> None:
    model, tokenizers, _ = load_run(run)
    model.eval()
    data = cast(SpeechData, read_run_data(RunDir(run), "valid"))
    tokenizer = cast(Tokenizer, tokenizers["tgt"])
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(folder).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    limit = hf.config.max_target_positions - 1
    ours, theirs, gap = [], [], 0.0
    for i, batch in enumerate(data.eval_batches("valid")):
        src = cast(torch.Tensor, batch.src)
        features = extractor(list(src.numpy()), sampling_rate=extractor.sampling_rate, return_tensors="pt")
        with torch.no_grad():
            ours += [tokenizer.decode(ids) for ids in greedy(model, src, max_len=limit)]
            out = hf.generate(features.input_features, max_new_tokens=limit)  # its limit: start + new <= positions
            theirs += hf_tokenizer.batch_decode(out, skip_special_tokens=True)
            if i == 0:
                tgt_in = cast(torch.Tensor, batch.tgt_in)
                logits = hf(input_features=features.input_features, decoder_input_ids=tgt_in).logits
                gap = (model(src, tgt_in) - logits).abs().max().item()
    references = data.transcripts("valid")
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"{len(references)} validation strings; the same transcript from both: {same}")
    print(f"attnlab greedy:       WER {error_rates(ours, references)['wer']:.2%}")
    print(f"transformers generate: WER {error_rates(theirs, references)['wer']:.2%}")
    print(f"largest logit difference, first batch, teacher-forced: {gap:.2e}")


if __name__ == "__main__":
    main(*sys.argv[1:])
