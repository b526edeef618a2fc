"""The CTC speech recogniser (issue 62, deliverable 4): arch whisper_ctc (nn/speech.py's CTCRecognizer) under
data.task speech_recognition, learnt by the CTC loss and read by CTC's best path or prefix beam search
(tasks/transcribers.py, decode/ctc.py). Pips as in tests/test_speech_recognition.py."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
import soundfile as sf
import torch
import torch.nn.functional as F
from test_speech_recognition import RATE, RECIPE, pip, write_pips

from attnlab import build_model
from attnlab.data.batching import Batch, pad_sequences
from attnlab.models import FAMILIES
from attnlab.tasks import TASKS
from attnlab.tasks.transcribers import ConnectionistTemporal, TeacherForcing, transcriber_of

from helpers import run_cli, sized

TINY = dict(
    arch="whisper_ctc", features=dict(n_mels=16), stack=dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, dropout=0.0)
)
SHAPE = dict(sample_rate=RATE, samples=8000, vocab_size=7, pad_id=0)


def tiny_ctc(seed: int = 0):
    torch.manual_seed(seed)
    return build_model(*sized(**TINY, **SHAPE)).eval()


def test_the_recognisers_fit_speech_recognition_and_not_classification():
    fits = {
        name: sorted(f for f, family in FAMILIES.items() if task.fits(family.capabilities))
        for name, task in TASKS.items()
    }
    assert fits["speech_recognition"] == ["whisper", "whisper_ctc"]
    assert "whisper_ctc" not in fits["audio_classification"] and "whisper" not in fits["audio_classification"]
    assert isinstance(transcriber_of(tiny_ctc()), ConnectionistTemporal)


def test_the_frames_log_probabilities_are_each_clips_own():
    model = tiny_ctc()
    waves = torch.zeros(2, 6000)
    waves[0, :2500], waves[1] = torch.randn(2500), torch.randn(6000)
    with torch.no_grad():
        log_probs, frames = model.ctc_log_probs(waves)
        alone, n = model.ctc_log_probs(waves[:1, :2500])
    assert frames.tolist() == [16, 38] and n.tolist() == [16]  # 31 and 75 frames of 10 ms, halved by the stem
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(2, 38), atol=1e-5)
    assert torch.allclose(log_probs[0, :16], alone[0], atol=1e-5)


def test_the_ctc_loss_of_a_batch_is_the_sum_of_each_strings_own():
    """Padding, the targets after BOS and each clip's frames: the batch's loss equals torch's ctc_loss of
    each string alone, unpadded, and the blank is the PAD id."""
    model = tiny_ctc(2)
    waves = torch.zeros(3, 5000)
    lengths = (5000, 3100, 4200)
    for row, n in enumerate(lengths):
        waves[row, :n] = torch.randn(n)
    digits = [[4, 5, 5], [6], [4, 6]]
    batch = Batch(
        src=waves, tgt_in=pad_sequences([[1] + d for d in digits]), tgt_out=pad_sequences([d + [2] for d in digits])
    )
    loss, nll = ConnectionistTemporal().loss(model, batch, 0.1, contextlib.nullcontext)
    expected = 0.0
    with torch.no_grad():
        for row, (n, d) in enumerate(zip(lengths, digits)):
            log_probs, frames = model.ctc_log_probs(waves[row : row + 1, :n])
            expected += F.ctc_loss(
                log_probs[0], torch.tensor(d), frames, torch.tensor([len(d)]), blank=0, reduction="sum"
            ).item()
    assert loss.item() == pytest.approx(expected, rel=1e-5) and torch.equal(loss.detach(), nll)


def test_ctc_takes_the_searchs_width_and_nbest():
    ctc, plain = ConnectionistTemporal(), TeacherForcing()
    from attnlab.decode.spec import CTC, Beam, Greedy

    assert ctc.search(Greedy(batch_size=8)) == CTC(batch_size=8)
    assert ctc.search(Beam(width=5, nbest=2)) == CTC(width=5, nbest=2) == ctc.search(CTC(width=5, nbest=2))
    assert plain.search(Beam(width=5)) == Beam(width=5)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny CTC recogniser trained on strings of three pips until it transcribes them."""
    root = tmp_path_factory.mktemp("ctc")
    rec = write_pips(root / "rec")
    config = root / "ctc.yaml"
    config.write_text(
        RECIPE.format(recordings=rec, steps=300)
        .replace("arch: whisper\n", "arch: whisper_ctc\n")
        .replace("  positions: {max_len: 8}\n", "")
    )
    done = run_cli("train", str(config), "--out", str(root / "run"))
    assert done.returncode == 0, done.stderr
    return root


def test_a_tiny_ctc_recogniser_learns_strings_of_pips(trained):
    records = [json.loads(line) for line in (trained / "run" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if r["split"] == "valid"][-1]
    assert last["wer"] < 0.1 and last["exact_match"] > 0.8  # chance: a WER near 1


def test_evaluate_and_transcribe_read_a_ctc_run_by_best_path_or_prefix_beam(trained, tmp_path):
    run = str(trained / "run")
    best = json.loads(run_cli("evaluate", run, "--split", "valid", "--beam", "1", "--json").stdout)
    beam = run_cli("evaluate", run, "--split", "valid", "--beam", "4")
    assert best["ctc"] and best["beam"] == 1 and best["wer"] < 0.1 and best["strings"] == 24
    assert beam.returncode == 0 and "(24 strings, split valid, CTC prefix beam 4)" in beam.stdout.splitlines()[0]
    rng = np.random.default_rng(5)
    sf.write(
        tmp_path / "a.wav", np.concatenate([pip("2", 0.25, rng), np.zeros(400, np.float32), pip("1", 0.2, rng)]), RATE
    )
    done = run_cli("transcribe", run, str(tmp_path / "a.wav"), "--beam", "3", "--nbest", "2")
    lines = [line.split("\t") for line in done.stdout.splitlines()]
    assert done.returncode == 0 and len(lines) == 2 and lines[0][1] == "2 1", done.stderr
    assert float(lines[0][2]) >= float(lines[1][2])


def test_inspect_draws_a_ctc_runs_posteriors_over_time(trained, tmp_path):
    rng = np.random.default_rng(9)
    sf.write(
        tmp_path / "a.wav", np.concatenate([pip("0", 0.25, rng), np.zeros(600, np.float32), pip("2", 0.2, rng)]), RATE
    )
    done = run_cli(
        "inspect", str(trained / "run"), "--src", str(tmp_path / "a.wav"), "--out", str(tmp_path / "fig"), "--beam", "1"
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "fig" / "summary.json").read_text())
    assert summary["transcript"] == "0 2" and summary["centroids"] is None and summary["monotonic"]
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == [
        "alignment.png",
        "encoder-0-self.png",
        "spectrogram.png",
        "summary.json",
    ]
