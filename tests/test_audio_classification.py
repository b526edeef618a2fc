"""Audio classification (issue 62, deliverable 3) through issue 61's seams: the input kind waveforms
(models/audio.py), the families ast and audio_cnn, data.task audio_classification. The data are tones
written by soundfile into tmp_path, named as FSDD's recordings ({digit}_{speaker}_{index}.wav), whose
pitch is the label."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from attnlab import ConfigError, DataError, build_model
from attnlab.models import DataShape
from attnlab.nn.spectrogram import LogMel
from attnlab.runs.checkpoint import load_run
from attnlab.tasks.recordings import recordings_in

from helpers import run_cli, sized

RATE = 8000
PITCHES = {"0": 400.0, "1": 1500.0}  # digit -> the tone's pitch in Hz
SHAPE = dict(sample_rate=RATE, samples=4000, n_classes=2)
TINY_AST = dict(
    arch="ast",
    features=dict(n_mels=16),
    patches=dict(size=4),
    stack=dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, dropout=0.0),
)


def write_tones(folder, indices=range(12), speakers=("ann", "bob"), seed=0, rate=RATE):
    """A tone of the digit's pitch (within 5%), 0.2-0.45 s long, with a little noise, per (digit, speaker, index)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for digit, pitch in PITCHES.items():
        for speaker in speakers:
            for index in indices:
                t = np.arange(int(rate * rng.uniform(0.2, 0.45))) / rate
                x = 0.5 * np.sin(2 * np.pi * pitch * rng.uniform(0.95, 1.05) * t) + 0.02 * rng.standard_normal(len(t))
                sf.write(folder / f"{digit}_{speaker}_{index}.wav", x.astype(np.float32), rate, subtype="PCM_16")
    return folder


@pytest.mark.parametrize("arch", ["ast", "audio_cnn"])
def test_the_model_computes_nn_spectrograms_log_mel_on_the_waveform(arch):
    """The log-mel inside the model is LogMel's with the window and hop of the config's milliseconds;
    in eval mode the image is its transpose (the AST's cut to whole patches), in training SpecAugment
    zeroes whole bands and spans and leaves the rest."""
    fields = TINY_AST if arch == "ast" else dict(arch="audio_cnn", width=4, features=dict(n_mels=16))
    torch.manual_seed(0)
    model = build_model(*sized(**fields, **SHAPE)).eval()
    waveform = torch.randn(2, 4000)
    reference = LogMel(rate=RATE, n_fft=200, hop=80, n_mels=16)(waveform)  # 25 ms, 10 ms at 8 kHz
    assert reference.shape == (2, 50, 16)
    assert torch.equal(model.spectrogram.features(waveform), reference)
    image, frames = model.spectrogram(waveform, torch.tensor([4000, 800]))
    kept = 48 if arch == "ast" else 50  # 50 frames, 12 whole patches of 4
    assert torch.equal(image, reference[:, :kept].transpose(1, 2)[:, None]) and frames.tolist() == [kept, 10]
    model.train()
    torch.manual_seed(1)
    augmented, _ = model.spectrogram(waveform, torch.tensor([4000, 800]))
    zeroed = augmented == 0
    assert zeroed.any() and torch.equal(augmented[~zeroed], image[~zeroed])


def test_the_ast_skips_patches_past_the_end_of_a_clip():
    """Samples past the frames of a clip's last patch change nothing; inside it they do."""
    torch.manual_seed(0)
    model = build_model(*sized(**{**TINY_AST, "features": dict(n_mels=16, scaling="log")}, **SHAPE)).eval()
    clip = torch.randn(1, 4000)
    clip[:, 1200:] = 0  # 1,200 samples: 15 frames, patches of columns 0-3 (frames 0-15)
    noisy = clip.clone()
    noisy[:, 16 * 80 + 100 :] = torch.randn(1, 4000 - 16 * 80 - 100)  # past frame 15's window
    lengths = torch.tensor([1200])
    with torch.no_grad():
        assert torch.allclose(model.classify(clip, lengths), model.classify(noisy, lengths), atol=1e-6)
        assert not torch.allclose(
            model.classify(clip, torch.tensor([4000])), model.classify(noisy, torch.tensor([4000])), atol=1e-4
        )


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(features=dict(n_mels=18)), r"^features.n_mels \(18\) must be divisible by patches.size \(4\)$"),
        (dict(features=dict(n_mels=16, hop_ms=30.0)), r"^features.hop_ms \(30.0\) must be at most window_ms \(25.0\)"),
        (
            dict(features=dict(n_mels=128)),
            r"^features.n_mels \(128\) must be at most the 101 frequency bins of a 25 ms window",
        ),
        (dict(augment=dict(time_masks=-1)), r"^augment.time_masks must be >= 0"),
    ],
)
def test_the_configs_refuse_in_one_line_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        sized(**{**TINY_AST, **fields}, **SHAPE)


def test_the_data_shape_checks_the_sound_sizes():
    assert DataShape(sample_rate=RATE, samples=10).to_dict() == {"pad_id": 0, "sample_rate": 8000, "samples": 10}
    with pytest.raises(ConfigError, match=r"^shape.samples must be at least 1 \(got 0\)$"):
        DataShape(samples=0)
    with pytest.raises(ConfigError, match=r"^arch 'ast' needs sample_rate from its data, which gives none$"):
        build_model(*sized(**TINY_AST, n_classes=2))


def test_the_validation_split_is_the_indices_5_to_9_and_the_label_a_field(tmp_path):
    write_tones(tmp_path / "rec")
    found = recordings_in(tmp_path / "rec")
    assert len(found) == 48 and {r.speaker for r in found} == {"ann", "bob"}
    from attnlab.tasks import task_config
    from attnlab.tasks.batching import Batching

    cfg = task_config({"task": "audio_classification", "recordings": str(tmp_path / "rec"), "clip_seconds": 0.3})
    data = cfg.task.prepare(Batching(max_tokens=0, batch_size=8, seed=0))
    assert [len(data.splits[s][2]) for s in ("train", "valid")] == [28, 20]  # 2 x 2 x 5 held out
    assert data.labels == ["0", "1"] and data.splits["train"][0].shape == (28, 2400)
    assert data.cut == sum(sf.info(r.path).frames > 2400 for r in found)
    cfg = task_config({"task": "audio_classification", "recordings": str(tmp_path / "rec"), "label": "speaker"})
    assert cfg.task.prepare(Batching(max_tokens=0, batch_size=8, seed=0)).labels == ["ann", "bob"]


def test_the_speaker_held_out_split_is_every_recording_of_one_speaker(tmp_path):
    """valid_speaker: that speaker's recordings (every index) are the validation split, the others' the
    training split; learning the speaker, or choosing by index as well, is refused in one line, and a
    speaker absent from the folder is named with the ones there."""
    from attnlab.tasks import task_config
    from attnlab.tasks.batching import Batching

    write_tones(tmp_path / "rec", speakers=("ann", "bob", "cat"))
    section = {"task": "audio_classification", "recordings": str(tmp_path / "rec"), "clip_seconds": 0.3}
    data = task_config({**section, "valid_speaker": "bob"}).task.prepare(Batching(max_tokens=0, batch_size=8, seed=0))
    assert [len(data.splits[s][2]) for s in ("train", "valid")] == [48, 24]  # 2 digits x 12 indices each
    with pytest.raises(ConfigError, match=r"^valid_speaker \('bob'\) holds a speaker out, so label 'speaker'"):
        task_config({**section, "valid_speaker": "bob", "label": "speaker"})
    with pytest.raises(
        ConfigError, match=r"^valid_speaker \('bob'\) makes the validation split .* give one or the other$"
    ):
        task_config({**section, "valid_speaker": "bob", "valid_first": 0})
    with pytest.raises(
        DataError, match=r"no validation recordings \(validation: speaker 'dan'\); its speakers: ann, bob, cat$"
    ):
        task_config({**section, "valid_speaker": "dan"}).task.prepare(Batching(max_tokens=0, batch_size=8, seed=0))


RECIPE = """\
model: {{arch: {arch}, {model}}}
data: {{task: audio_classification, recordings: {recordings}, clip_seconds: 0.5}}
train: {{max_steps: {steps}, batch_size: 8, optimizer: adamw, lr_schedule: constant, lr: 3.0e-3, warmup_steps: 1,
        eval_every: {steps}, log_every: 1, label_smoothing: 0.0, early_stop_metric: accuracy, progress: false}}
"""
AST_MODEL = (
    "features: {n_mels: 16}, patches: {size: 4}, stack: {d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64, dropout: 0.0}"
)


def test_a_two_step_run_predicts_probabilities_and_evaluate_counts_as_by_hand(tmp_path):
    rec = write_tones(tmp_path / "rec")
    config = tmp_path / "cnn.yaml"
    config.write_text(
        RECIPE.format(arch="audio_cnn", model="features: {n_mels: 16}, width: 4", recordings=rec, steps=2)
    )
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "recordings: train 28, valid 20; 2 classes 0, 1; clips of 4,000 samples (0 cut)" in done.stdout
    assert json.loads((tmp_path / "run" / "shape.json").read_text()) == {
        "pad_id": 0,
        "n_classes": 2,
        "sample_rate": 8000,
        "samples": 4000,
    }
    valid = sorted(p for p in rec.iterdir() if 5 <= int(p.stem.split("_")[2]) <= 9)
    predicted = run_cli("predict", str(tmp_path / "run"), *map(str, valid), "--json")
    assert predicted.returncode == 0, predicted.stderr
    records = [json.loads(line) for line in predicted.stdout.splitlines()]
    assert [r["input"] for r in records] == list(map(str, valid))
    assert all(sum(r["probabilities"].values()) == pytest.approx(1.0, abs=1e-6) for r in records)
    right = sum(
        max(r["probabilities"], key=r["probabilities"].get) == p.stem.split("_")[0] for r, p in zip(records, valid)
    )
    split = json.loads(run_cli("evaluate", str(tmp_path / "run"), "--split", "valid", "--json").stdout)
    assert split["examples"] == 20 and split["accuracy"] == right / 20
    only_valid = tmp_path / "valid"
    only_valid.mkdir()
    for p in valid:
        (only_valid / p.name).write_bytes(p.read_bytes())
    folder = json.loads(run_cli("evaluate", str(tmp_path / "run"), "--data", str(only_valid), "--json").stdout)
    assert folder["accuracy"] == right / 20 and folder["confusion"] == split["confusion"]
    long = tmp_path / "long.wav"
    sf.write(long, np.zeros(RATE, dtype=np.float32), RATE)  # 1 s, the model reads 0.5 s
    cut = run_cli("predict", str(tmp_path / "run"), str(long))
    assert (
        cut.returncode == 0
        and cut.stderr == f"note: {long}: longer than the model's 0.5 s; its first 0.5 s classified\n"
    )
    # the model in the run gives what predict printed
    model, _, _ = load_run(tmp_path / "run")
    x = torch.zeros(1, 4000)
    sound = torch.from_numpy(sf.read(valid[0], dtype="float32")[0])
    x[0, : len(sound)] = sound
    with torch.no_grad():
        p = model.classify(x, torch.tensor([len(sound)])).softmax(-1)[0]
    assert list(records[0]["probabilities"].values()) == pytest.approx(p.tolist(), abs=1e-5)


@pytest.mark.parametrize(
    "arch, model",
    [
        ("ast", AST_MODEL),
        ("audio_cnn", "features: {n_mels: 16}, width: 8"),
        (
            "whisper_encoder",
            "features: {n_mels: 16}, stack: {d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64, dropout: 0.0}",
        ),
        ("waveform_transformer", "stack: {d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64, dropout: 0.0}"),
    ],
)
def test_a_tiny_model_learns_two_tones(tmp_path, arch, model):
    rec = write_tones(tmp_path / "rec")
    config = tmp_path / "model.yaml"
    config.write_text(RECIPE.format(arch=arch, model=model, recordings=rec, steps=40))
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in records if r["split"] == "valid"][-1]["accuracy"] > 0.9  # chance: 0.5
    train = [r["loss"] for r in records if r["split"] == "train"]
    assert sum(train[-5:]) < sum(train[:5])


def one_line(done, text):
    assert done.returncode != 0 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert text in done.stderr, done.stderr


def test_bad_inputs_are_one_line_each_naming_the_file(tmp_path):
    rec = write_tones(tmp_path / "rec", indices=range(5, 7))
    write_tones(tmp_path / "rec", indices=range(20, 22))
    config = tmp_path / "cnn.yaml"
    config.write_text(
        RECIPE.format(arch="audio_cnn", model="features: {n_mels: 16}, width: 4", recordings=rec, steps=1)
    )
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    (tmp_path / "text.wav").write_text("not a sound\n")
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "nothing").mkdir()
    one_line(
        run_cli("predict", str(tmp_path / "run"), str(tmp_path / "text.wav")),
        f"{tmp_path / 'text.wav'}: not an audio file that soundfile reads",
    )
    one_line(
        run_cli("predict", str(tmp_path / "run"), str(tmp_path / "empty.wav")),
        f"{tmp_path / 'empty.wav'}: empty file (0 bytes), not audio",
    )
    one_line(
        run_cli("evaluate", str(tmp_path / "run"), "--data", str(tmp_path / "nothing")),
        f"{tmp_path / 'nothing'}: no audio files",
    )
    sf.write(rec / "tone.wav", np.zeros(100, dtype=np.float32), RATE)
    one_line(
        run_cli("train", str(config), "--out", str(tmp_path / "run2")),
        f"{rec / 'tone.wav'}: not named {{digit}}_{{speaker}}_{{index}}",
    )
    (rec / "tone.wav").unlink()
    (rec / "1_ann_3.wav").write_bytes(b"RIFF\x00\x00")
    one_line(run_cli("train", str(config), "--out", str(tmp_path / "run3")), f"{rec / '1_ann_3.wav'}:")
    assert not (tmp_path / "run2").exists() and not (tmp_path / "run3").exists()
    with pytest.raises(DataError, match="no validation recordings"):
        from attnlab.tasks import task_config
        from attnlab.tasks.batching import Batching

        cfg = task_config({"task": "audio_classification", "recordings": str(rec), "valid_first": 30, "valid_last": 40})
        cfg.task.prepare(Batching(max_tokens=0, batch_size=8, seed=0))


def test_info_plans_an_audio_config_without_reading_its_data(tmp_path):
    """`attnlab info` builds the model on the meta device: the mel bank is made on the CPU all the same;
    before the data is read, two classes (as image_classification plans)."""
    config = tmp_path / "ast.yaml"
    config.write_text(RECIPE.format(arch="ast", model=AST_MODEL, recordings=tmp_path / "absent", steps=1))
    done = run_cli("info", str(config))
    assert done.returncode == 0, done.stderr
    cfg, shape = sized(**TINY_AST, sample_rate=RATE, samples=4000, n_classes=2)
    n = sum(p.numel() for p in build_model(cfg, shape).parameters())
    line = next(line for line in done.stdout.splitlines() if line.startswith("parameters "))
    assert line.split() == ["parameters", f"{n:,}"]


TINY_STACK = dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, dropout=0.0)


@pytest.mark.parametrize(
    "fields, tokens",
    [
        (dict(arch="whisper_encoder", features=dict(n_mels=16), stack=TINY_STACK), 50),  # 100 frames of 10 ms / 2
        (TINY_AST, 1 + 4 * 25),  # a class token and (16 / 4) x (100 / 4) patches
        (dict(arch="waveform_transformer", waveform=dict(frame_ms=10.0, streams=3), stack=TINY_STACK), 1 + 10 + 100),
    ],
)
def test_info_counts_tokens_and_flops_per_second_of_audio(fields, tokens):
    """Per second of audio at 8 kHz: the encoder's tokens, and its FLOPs as the formulas give them for
    T tokens of width d (2 per multiply-add): projections 2 T 4 d^2, scores 2 (2 T^2 d), feed-forward
    2 T 2 d d_ff, the head 2 d n_classes; the front end the rest."""
    from attnlab.analysis.budget import sound_report

    report = sound_report(*sized(**fields, sample_rate=RATE, samples=4000, n_classes=3))
    d, d_ff, T = 32, 64, tokens
    assert report["tokens"] == T
    assert report["forward_by_kind"] == {
        "attention_projections": 2 * T * 4 * d * d,
        "attention_scores": 2 * 2 * T * T * d,
        "feed_forward": 2 * T * 2 * d * d_ff,
        "output": 2 * d * 3,
        "front_end": report["forward_flops"] - 2 * T * (4 * d * d + 2 * T * d + 2 * d * d_ff) - 2 * d * 3,
    }
    assert report["forward_by_kind"]["front_end"] > 0


@pytest.mark.parametrize("arch, output", [("whisper", 0), ("whisper_ctc", 2 * 50 * 32 * 9)])
def test_info_counts_a_recognisers_encoder_per_second_of_audio(arch, output):
    """A recogniser's cost per second is its encoder's over the 50 frame tokens (100 frames of 10 ms,
    halved by the stem), and, for CTC, the map of each token to the 9 symbols; the encoder-decoder's
    decoder runs once per output token, not per second: not counted (it crashed `info` before)."""
    from attnlab.analysis.budget import sound_report

    fields = dict(arch=arch, features=dict(n_mels=16), stack=TINY_STACK)
    report = sound_report(*sized(**fields, sample_rate=RATE, samples=4000, vocab_size=9, pad_id=0))
    d, d_ff, T = 32, 64, 50
    assert report["tokens"] == T
    assert {kind: n for kind, n in report["forward_by_kind"].items() if kind != "front_end"} == {
        "attention_projections": 2 * T * 4 * d * d,
        "attention_scores": 2 * 2 * T * T * d,
        "feed_forward": 2 * T * 2 * d * d_ff,
        "output": output,
    }
    assert report["forward_by_kind"]["front_end"] > 0


def test_info_prints_the_cost_of_a_second_of_audio_and_a_cnn_has_no_tokens(tmp_path):
    config = tmp_path / "cnn.yaml"
    config.write_text(
        RECIPE.format(arch="audio_cnn", model="features: {n_mels: 16}, width: 4", recordings=tmp_path, steps=1)
    )
    done = run_cli("info", str(config))
    assert done.returncode == 0, done.stderr
    block = done.stdout[done.stdout.index("per 1 s of audio at 8,000 Hz") :].splitlines()
    assert block[1].split() == ["tokens", "none", "(no", "tokens)"] and block[2].split()[:2] == ["forward", "FLOPs"]
    assert json.loads(run_cli("info", str(config), "--json").stdout)["audio"]["tokens"] is None


def test_inspect_draws_the_summarys_attention_on_the_spectrogram_and_a_cnn_has_none(tmp_path):
    """An AST run on one recording: the prediction `predict` gives, and per layer the class token's
    attention over the 4 x 12 patches (its row of the layer's weights, the bands' order flipped so that
    the low bands are drawn at the bottom), the rollout and every figure; a frames model's one row of
    frame tokens; the CNN has no attention to inspect."""
    from attnlab.analysis.capture import capture_attention

    rec = write_tones(tmp_path / "rec", indices=range(5, 12))
    for arch, model in (
        ("ast", AST_MODEL),
        ("whisper_encoder", "features: {n_mels: 16}, stack: {d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64}"),
    ):
        config = tmp_path / f"{arch}.yaml"
        config.write_text(RECIPE.format(arch=arch, model=model, recordings=rec, steps=2))
        assert run_cli("train", str(config), "--out", str(tmp_path / arch)).returncode == 0
    wav = rec / "1_ann_5.wav"
    done = run_cli("inspect", str(tmp_path / "ast"), "--src", str(wav), "--out", str(tmp_path / "figures"))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "figures" / "summary.json").read_text())
    predicted = run_cli("predict", str(tmp_path / "ast"), str(wav)).stdout.split("\t")[1]
    assert summary["prediction"]["label"] == predicted and summary["grid"] == [4, 12]
    model, _, _ = load_run(tmp_path / "ast")
    sound, _ = sf.read(wav, dtype="float32")
    waves = torch.zeros(1, 4000)
    waves[0, : len(sound)] = torch.from_numpy(sound)
    with torch.no_grad(), capture_attention(model.eval()) as captured:
        model.classify(waves, torch.tensor([len(sound)]))
    for name, record in captured.last().items():
        expected = record.probs[0, :, 0, 1:].unflatten(-1, (4, 12)).flip(-2)  # (H, 4, 12): the class token's row
        assert torch.allclose(torch.tensor(summary["token_attention"][name]), expected, atol=1e-6), name
    assert {Path(f).name for f in summary["files"]} >= {"spectrogram.png", "rollout.png", "encoder-0-spectrogram.png"}
    done = run_cli("inspect", str(tmp_path / "whisper_encoder"), "--src", str(wav), "--out", str(tmp_path / "frames"))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "frames" / "summary.json").read_text())["grid"] == [1, 25]  # 50 frames, two a token
    config = tmp_path / "cnn.yaml"
    config.write_text(
        RECIPE.format(arch="audio_cnn", model="features: {n_mels: 16}, width: 4", recordings=rec, steps=1)
    )
    assert run_cli("train", str(config), "--out", str(tmp_path / "cnn")).returncode == 0
    one_line(run_cli("inspect", str(tmp_path / "cnn"), "--src", str(wav)), "which has no attention to inspect")
