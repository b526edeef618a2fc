"""Speech recognition (issue 62, deliverable 4): strings of spoken digits made from single-digit
recordings (data/spoken_strings.py), the Whisper-shaped encoder-decoder (arch whisper: nn/speech.py),
data.task speech_recognition, WER and CER through jiwer, and `attnlab transcribe`. The recordings are
pips written into tmp_path (:func:`write_pips`): Hann-windowed tones whose pitch is the digit, so that
two of one digit side by side are still two."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import soundfile as sf
import torch
from test_audio_classification import RATE, one_line

from attnlab import ConfigError, DataError, build_model
from attnlab.data.spoken_strings import Recorded, SpokenString
from attnlab.decode.spec import Beam, Greedy
from attnlab.eval.metrics import error_rates
from attnlab.nn.speech import clip_lengths
from attnlab.runs.checkpoint import load_run
from attnlab.tasks import task_config
from attnlab.tasks.batching import Batching

from helpers import run_cli, sized

TINY = dict(
    arch="whisper",
    features=dict(n_mels=16),
    stack=dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, dropout=0.0),
    positions=dict(max_len=12),
)
SHAPE = dict(sample_rate=RATE, samples=8000, vocab_size=9, pad_id=0)


PITCHES = {"0": 400.0, "1": 900.0, "2": 1800.0}  # digit -> the pip's pitch in Hz


def pip(digit: str, seconds: float, rng: np.random.Generator) -> np.ndarray:
    n = int(RATE * seconds)
    t = np.arange(n) / RATE
    tone = np.sin(2 * np.pi * PITCHES[digit] * rng.uniform(0.95, 1.05) * t)
    return (0.5 * np.hanning(n) * tone + 0.01 * rng.standard_normal(n)).astype(np.float32)


def write_pips(folder, indices=range(12), speakers=("ann", "bob"), seed=0):
    """A pip of the digit's pitch (within 5%), 0.15-0.3 s long, with a little noise, per (digit, speaker, index)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for digit in PITCHES:
        for speaker in speakers:
            for index in indices:
                sound = pip(digit, rng.uniform(0.15, 0.3), rng)
                sf.write(folder / f"{digit}_{speaker}_{index}.wav", sound, RATE, subtype="PCM_16")
    return folder


def tiny_recogniser(seed: int = 0):
    torch.manual_seed(seed)
    return build_model(*sized(**TINY, **SHAPE)).eval()


def test_a_clip_ends_at_its_last_sounding_sample():
    x = torch.tensor([[0.5, 0.0, -0.2, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.1, 0.1, 0.1, 0.3]])
    assert clip_lengths(x).tolist() == [3, 1, 5]


def test_a_clip_is_encoded_the_same_alone_and_beside_a_longer_one():
    """The memory of a clip's own tokens does not depend on the padding a longer clip in its batch adds,
    and the padded tokens are marked invalid."""
    model = tiny_recogniser()
    short, long = torch.randn(3000), torch.randn(7000)
    batch = torch.zeros(2, 7000)
    batch[0, :3000], batch[1] = short, long
    with torch.no_grad():
        alone, valid_alone = model.encode(short[None])
        both, valid = model.encode(batch)
    n = int(valid_alone.sum())
    assert n == 19 and valid[0].sum() == n and valid[1].all()  # 3,000 samples: 37 frames of 10 ms, 19 tokens
    assert torch.allclose(both[0, :n], alone[0, :n], atol=1e-5)


def test_cached_decoding_equals_uncached_and_greedy_follows_the_argmax():
    """Greedy and beam search with the KV cache equal the recomputed ones; greedy's tokens are the
    argmax of the model's own logits, fed back by hand."""
    model = tiny_recogniser(1)
    waves = torch.randn(3, 6000)
    waves[1, 4000:] = 0
    for search in (Greedy(max_len=6), Beam(width=3, nbest=2, max_len=6)):
        cached = search.decode(model, waves)
        uncached = dataclasses.replace(search, use_cache=False).decode(model, waves)
        assert [[ids for ids, _ in n] for n in cached] == [[ids for ids, _ in n] for n in uncached]
        for (a, sa), (b, sb) in zip([h for n in cached for h in n], [h for n in uncached for h in n]):
            assert (sa is None and sb is None) or math.isclose(sa, sb, abs_tol=1e-5)
    with torch.no_grad():
        memory, valid = model.encode(waves[:1])
        ids = [1]  # BOS
        for _ in range(6):
            logits = model.decode(torch.tensor([ids]), memory, valid)[0, -1]
            logits[[0, 1]] = -math.inf  # PAD and BOS are never outputs
            ids.append(int(logits.argmax()))
            if ids[-1] == 2:  # EOS
                break
    expected = [t for t in ids[1:] if t != 2]
    assert Greedy(max_len=6).decode(model, waves[:1])[0][0][0] == expected


def test_a_string_is_its_recordings_joined_by_silences_with_noise_at_the_snr():
    sounds = [np.full(n, v, dtype=np.float32) for n, v in ((400, 0.5), (300, -0.25), (500, 1.0))]
    split = Recorded(sounds, ["3", "3", "7"], rate=1000)
    string = SpokenString((2, 0, 1), (5, 0), noise_seed=4)
    x = split.waveform(string, None)
    assert split.transcript(string) == "7 3 3" and split.samples(string) == len(x) == 1205
    assert np.array_equal(x, np.concatenate([sounds[2], np.zeros(5), sounds[0], sounds[1]]).astype(np.float32))
    noisy = split.waveform(string, 10.0)
    noise = noisy - x
    snr = 10 * math.log10(np.mean(x.astype(np.float64) ** 2) / np.mean(noise.astype(np.float64) ** 2))
    assert abs(snr - 10.0) < 0.3 and np.array_equal(
        noisy, split.waveform(string, 10.0)
    )  # the same seed, the same noise


def test_strings_are_drawn_within_the_limits_and_the_same_for_the_same_seed():
    sounds = [np.ones(100 * (1 + i % 3), dtype=np.float32) for i in range(12)]
    split = Recorded(sounds, [str(i % 4) for i in range(12)], rate=1000)
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    a = [split.draw(rng_a, (2, 4), 30, 700, "rec") for _ in range(200)]
    assert a == [split.draw(rng_b, (2, 4), 30, 700, "rec") for _ in range(200)]
    assert {len(s.recordings) for s in a} == {2, 3, 4}
    assert all(0 <= g <= 30 for s in a for g in s.gaps) and 0 in {g for s in a for g in s.gaps}
    assert all(split.samples(s) <= 700 for s in a) and max(split.samples(s) for s in a) > 600
    words = [split.words[r] for s in a for r in s.recordings]
    assert set(words) == {"0", "1", "2", "3"}
    with pytest.raises(DataError, match=r"^rec: 100 strings of 2-4 recordings in a row were longer than 0.15 s"):
        split.draw(np.random.default_rng(0), (2, 4), 30, 150, "rec")


def test_wer_and_cer_are_jiwers_edits_over_the_reference_words_and_characters():
    rates = error_rates(["1 2 3", "", "4 4"], ["1 2 4", "5 6", "4"])
    assert rates["wer"] == pytest.approx((1 + 2 + 1) / 6)  # a substitution, two deletions, an insertion
    assert rates["cer"] == pytest.approx((1 + 3 + 2) / 9)  # over 9 reference characters, spaces included
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        error_rates(["1", "2"], ["1"])


def section(rec, **fields):
    return {"task": "speech_recognition", "recordings": str(rec), **fields}


def test_the_task_draws_training_batches_from_seed_epoch_and_batch_and_scores_fixed_strings(tmp_path):
    rec = write_pips(tmp_path / "rec")
    cfg = task_config(
        section(rec, splits=dict(n_train=40, n_valid=12), strings=dict(max_digits=3, longest_seconds=2.0))
    )
    task = cfg.task
    data = task.prepare(Batching(max_tokens=0, batch_size=8, seed=0))
    again = task.prepare(Batching(max_tokens=0, batch_size=8, seed=0))
    epoch = data.epoch_batches(1)
    assert len(epoch) == 5
    assert torch.equal(epoch[3].src, again.epoch_batches(1)[3].src) and not torch.equal(
        epoch[3].tgt_out, epoch[2].tgt_out
    )
    assert data.transcripts("valid") == again.transcripts("valid") and len(data.transcripts("valid")) == 12
    other = task.prepare(Batching(max_tokens=0, batch_size=8, seed=1))  # another train.seed: other training strings
    assert not torch.equal(other.epoch_batches(1)[3].tgt_out, epoch[3].tgt_out)
    assert other.transcripts("valid") == data.transcripts("valid")  # ... and the same scored ones
    assert set(data.splits["valid"].words) == {"0", "1", "2"} and len(data.splits["valid"].sounds) == 30  # indices 5-9
    batch = data.eval_batches("valid")[0]
    tokenizer = data.tokenizers["tgt"]
    assert [tokenizer.decode(row[row > 3].tolist()) for row in batch.tgt_out] == data.transcripts("valid")[:8]
    assert (batch.src.shape[1] <= 2 * RATE) and clip_lengths(batch.src).max() == batch.src.shape[1]
    shape = task.data_shape(data)
    assert (shape.sample_rate, shape.samples, shape.vocab_size) == (RATE, 2 * RATE, tokenizer.vocab_size)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(strings=dict(min_digits=4, max_digits=3)), r"^strings.max_digits must be >= 4"),
        (dict(strings=dict(snr_db=float("nan"))), r"^strings.snr_db must be a finite number \(got nan\)$"),
        (dict(strings=dict(longest_seconds=0)), r"^strings.longest_seconds must be a positive number of seconds"),
        (dict(splits=dict(n_test=3)), r"^splits.n_test: data.task 'speech_recognition' does not read it"),
        (dict(valid_speaker="ann", valid_first=0), r"^valid_speaker \('ann'\) makes the validation split"),
    ],
)
def test_the_section_refuses_in_one_line_naming_the_field(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message):
        task_config(section(tmp_path, **fields))


RECIPE = """model:
  arch: whisper
  features: {{n_mels: 16}}
  augment: {{freq_masks: 0, time_masks: 0}}
  stack: {{d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64, dropout: 0.0}}
  positions: {{max_len: 8}}
data:
  task: speech_recognition
  recordings: {recordings}
  strings: {{min_digits: 1, max_digits: 3, max_gap_ms: 100, longest_seconds: 2.0}}
  splits: {{n_train: 320, n_valid: 24}}
train:
  max_steps: {steps}
  batch_size: 16
  optimizer: adamw
  lr: 3.0e-3
  lr_schedule: cosine
  warmup_steps: 10
  eval_every: {steps}
  eval_exact_match: 24
  progress: false
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny recogniser trained on strings of three pips until it transcribes them."""
    root = tmp_path_factory.mktemp("speech")
    rec = write_pips(root / "rec")
    config = root / "speech.yaml"
    config.write_text(RECIPE.format(recordings=rec, steps=200))
    done = run_cli("train", str(config), "--out", str(root / "run"))
    assert done.returncode == 0, done.stderr
    return root


def test_a_tiny_recogniser_learns_strings_of_pips(trained):
    records = [json.loads(line) for line in (trained / "run" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if r["split"] == "valid"][-1]
    assert last["wer"] < 0.1 and last["exact_match"] > 0.8  # chance: a WER near 1


def test_evaluate_scores_a_split_by_greedy_and_beam_search_with_jiwer(trained):
    run = str(trained / "run")
    greedy = run_cli("evaluate", run, "--split", "valid", "--beam", "1", "--json")
    assert greedy.returncode == 0, greedy.stderr
    result = json.loads(greedy.stdout)
    assert result["strings"] == 24 and result["beam"] == 1 and result["wer"] < 0.1
    model, tokenizers, _ = load_run(run)
    from attnlab.runs.data import read_run_data
    from attnlab.runs.run_dir import RunDir

    data = read_run_data(RunDir(run), "valid")
    hypotheses = [
        tokenizers["tgt"].decode(ids)
        for batch in data.eval_batches("valid")
        for (ids, _), *_ in Greedy(max_len=4).decode(model, batch.src)
    ]
    assert result["wer"] == pytest.approx(error_rates(hypotheses, data.transcripts("valid"))["wer"])
    beam = run_cli("evaluate", run, "--split", "valid", "--beam", "3")
    assert beam.returncode == 0, beam.stderr
    assert beam.stdout.startswith("WER  ") and "(24 strings, split valid, beam 3, lenpen 0.6)" in beam.stdout
    folder = write_pips(
        trained / "other", indices=range(30, 34), seed=3
    )  # recordings never seen: strings by the same rule
    other = run_cli("evaluate", run, "--data", str(folder), "--beam", "1", "--json")
    assert other.returncode == 0, other.stderr
    scored = json.loads(other.stdout)
    assert scored["strings"] == 24 and scored["wer"] < 0.2 and scored["examples"] != result["examples"]


def test_transcribe_writes_each_files_transcript(trained, tmp_path):
    rng = np.random.default_rng(5)
    silence = np.zeros(400, np.float32)
    sf.write(
        tmp_path / "a.wav", np.concatenate([pip("2", 0.25, rng), silence, pip("0", 0.2, rng), pip("0", 0.2, rng)]), RATE
    )
    sf.write(tmp_path / "b.wav", pip("1", 0.25, rng), RATE)
    done = run_cli("transcribe", str(trained / "run"), str(tmp_path / "a.wav"), str(tmp_path / "b.wav"), "--beam", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{tmp_path / 'a.wav'}\t2 0 0\n{tmp_path / 'b.wav'}\t1\n"
    nbest = run_cli("transcribe", str(trained / "run"), str(tmp_path / "b.wav"), "--beam", "3", "--nbest", "2")
    lines = nbest.stdout.splitlines()
    assert nbest.returncode == 0 and len(lines) == 2 and lines[0].split("\t")[1] == "1"
    assert float(lines[0].split("\t")[2]) >= float(lines[1].split("\t")[2])


def test_bad_inputs_to_transcribe_are_one_line_each(trained, tmp_path):
    run = str(trained / "run")
    (tmp_path / "text.wav").write_text("not a sound\n")
    one_line(run_cli("transcribe", run, str(tmp_path / "text.wav")), f"{tmp_path / 'text.wav'}: not an audio file")
    one_line(run_cli("transcribe", run), "give the recordings to transcribe as arguments")
    one_line(run_cli("transcribe", run, "x.wav", "--beam", "0"), "--beam must be between 1 and")
    (tmp_path / "out.txt").write_text("mine\n")
    one_line(run_cli("transcribe", run, str(tmp_path / "text.wav"), "--output", str(tmp_path / "out.txt")), "exists")
    assert (tmp_path / "out.txt").read_text() == "mine\n"
    one_line(run_cli("predict", run, "x.wav"), "is a run of data.task 'speech_recognition'")
    sf.write(tmp_path / "long.wav", np.full(int(2.5 * RATE), 0.1, np.float32), RATE)  # the run's strings: 2 s at most
    one_line(
        run_cli("transcribe", run, str(tmp_path / "long.wav")),
        f"{tmp_path / 'long.wav'}: 2.50 s, longer than the 2 s the model reads (data.strings.longest_seconds)",
    )


def test_inspect_draws_the_cross_attention_of_each_digit_over_time_and_its_alignment(trained, tmp_path):
    """The alignment figure is the last cross-attention layer's heads' mean, each digit's row; its centroids
    (the weighted mean time of each row) are those of the weights summary.json records, by hand."""
    rng = np.random.default_rng(8)
    silence = np.zeros(800, np.float32)
    sf.write(tmp_path / "a.wav", np.concatenate([pip("1", 0.25, rng), silence, pip("2", 0.25, rng)]), RATE)
    done = run_cli("inspect", str(trained / "run"), "--src", str(tmp_path / "a.wav"), "--out", str(tmp_path / "fig"))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "fig" / "summary.json").read_text())
    assert summary["transcript"] == "1 2" and not summary["target_given"]
    names = sorted(p.name for p in (tmp_path / "fig").iterdir())
    assert names == sorted(
        [
            "alignment.png",
            "spectrogram.png",
            "summary.json",
            "encoder-0-self.png",
            "decoder-0-self.png",
            "decoder-0-cross.png",
        ]
    )
    from attnlab.analysis.inspect_audio import centroids

    weights = torch.tensor([[0.0, 1.0, 3.0], [2.0, 0.0, 2.0]])
    assert centroids(weights, torch.tensor([0.1, 0.2, 0.3])) == pytest.approx([0.275, 0.2])
    first, second = summary["centroids"]
    assert first < 0.4 < second and summary["monotonic"]  # the first pip ends at 0.25 s, the second starts at 0.35 s


def test_info_of_a_recognisers_run_prints_the_cost_of_a_second_of_audio(trained):
    """`attnlab info RUN` of a speech run raised a TypeError (its model has no classify) until it counted
    the encoder (tests/test_audio_classification.py checks the figures)."""
    done = run_cli("info", str(trained / "run"))
    assert done.returncode == 0, done.stderr
    block = done.stdout[done.stdout.index("per 1 s of audio at 8,000 Hz") :].splitlines()
    assert block[1].split()[0] == "tokens" and int(block[1].split()[1]) > 0
