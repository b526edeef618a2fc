"""`attnlab import-hf` and `export-hf` of the AST: a tiny random ASTForAudioClassification (d 32, 2 layers,
16 Kaldi bands, 22 frames, 4 x 4 patches every 3 frames and bands, so that they overlap, 3 classes,
every tensor perturbed) and its ASTFeatureExtractor become an ast run whose standardised log fbank equals
the extractor's (<= 1e-4) and whose logits equal transformers' (float32, <= 1e-5) on clips of the whole
window and on a short one (which the extractor pads); `predict` on a WAV gives transformers' argmax; a run
attnlab trains with the AST's settings exports and transformers gives its logits; what either side
cannot represent is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import transformers

from attnlab.runs.checkpoint import load_run

from helpers import run_cli

RATE, FRAMES = 16_000, 22
SAMPLES = (FRAMES - 1) * 160 + 400  # 22 whole frames of 400 samples every 160: 3,760
LABELS = {0: "low", 1: "middle", 2: "high"}


def tiny_folder(path: Path, seed: int = 0, config: dict | None = None, extractor: dict | None = None) -> Path:
    """A random ASTForAudioClassification saved as transformers saves it, with its ASTFeatureExtractor."""
    hf_config = transformers.ASTConfig(
        **{
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "patch_size": 4,
            "frequency_stride": 3,
            "time_stride": 3,
            "max_length": FRAMES,
            "num_mel_bins": 16,
            "id2label": LABELS,
            "label2id": {v: k for k, v in LABELS.items()},
        }
        | (config or {})
    )
    torch.manual_seed(seed)
    model = transformers.ASTForAudioClassification(hf_config).eval()
    with torch.no_grad():  # the initial LayerNorms, biases and tokens are 1 and 0: make every tensor count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(path, safe_serialization=True)
    transformers.ASTFeatureExtractor(**{"num_mel_bins": 16, "max_length": FRAMES} | (extractor or {})).save_pretrained(
        path
    )
    return path


def clips(n: int = 3, samples: int = SAMPLES) -> torch.Tensor:
    """(n, samples) tones of three pitches over a little noise."""
    g = torch.Generator().manual_seed(1)
    t = torch.arange(samples) / RATE
    pitch = torch.tensor([300.0, 1200.0, 4000.0])[:n, None]
    return 0.5 * torch.sin(2 * torch.pi * pitch * t) + 0.02 * torch.randn(n, samples, generator=g)


def features(folder: Path, sound: torch.Tensor) -> torch.Tensor:
    extractor = transformers.ASTFeatureExtractor.from_pretrained(folder)
    return extractor(list(sound.numpy()), sampling_rate=RATE, return_tensors="pt").input_values  # (B, frames, bands)


def kaldi_features(folder: Path, sound: torch.Tensor) -> torch.Tensor:
    """attnlab's KaldiFbank of whole-window clips, standardised by the folder's extractor: the input_values
    attnlab's AST reads (the extractor's own differ by float32's rounding: 7e-6, test_spectrogram.py)."""
    from attnlab.nn.spectrogram import KaldiFbank

    extractor = json.loads((folder / "preprocessor_config.json").read_text())
    return (KaldiFbank(n_mels=extractor["num_mel_bins"])(sound) - extractor["mean"]) / (2 * extractor["std"])


def reference(folder: Path) -> transformers.ASTForAudioClassification:
    return transformers.ASTForAudioClassification.from_pretrained(folder, attn_implementation="eager").eval()


def imported(tmp_path: Path, folder: Path):
    done = run_cli("import-hf", str(folder), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    model, _, cfg = load_run(tmp_path / "run")
    return model.eval(), cfg


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("ast") / "hf")


def test_the_imported_run_has_the_asts_settings_and_the_extractors_features(tmp_path, folder):
    model, cfg = imported(tmp_path, folder)
    assert (
        cfg.features.filterbank,
        cfg.reading.reads,
        cfg.patches.hop,
        cfg.classifier.pooling,
        cfg.classifier.head,
    ) == (
        "kaldi",
        "window",
        3,
        "distilled",
        "normed",
    )
    sound = clips()
    ours = model.spectrogram.features(sound)  # (B, frames, bands), standardised
    assert ours.shape == (3, FRAMES, 16)
    assert (ours - features(folder, sound)).abs().max().item() <= 1e-4


def read_image(model, sound: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """What attnlab's AST reads of the clips, as the AST's input_values: (B, frames, bands)."""
    image, frames = model.spectrogram(sound, lengths)  # (B, 1, bands, frames)
    size, hop = model.patch_embed.patch_size, model.patch_embed.stride
    grid = ((image.shape[2] - size) // hop + 1, (image.shape[3] - size) // hop + 1)
    return model.reads(image, frames, grid, hop)[0][:, 0].transpose(1, 2)


def test_logits_equal_transformers_on_whole_windows_and_on_a_short_clip(tmp_path, folder):
    """The models on the same input_values (attnlab's features): logits within 1e-5; from the waveform,
    each side computing its own features (float32 here, float64 in the extractor's NumPy path): within
    1e-4. A clip of 0.15 s: the extractor pads its log fbank with zeros to 22 frames and the AST reads
    them all; attnlab's reads: window does the same from the zero-padded waveform."""
    model, _ = imported(tmp_path, folder)
    hf = reference(folder)
    short = torch.nn.functional.pad(clips(1, 2400), (0, SAMPLES - 2400))  # 1 + 2,000 // 160 = 13 frames its own
    for sound, lengths, alone in (
        (clips(), torch.full((3,), SAMPLES), clips()),
        (short, torch.tensor([2400]), clips(1, 2400)),
    ):
        with torch.no_grad():
            ours = model.classify(sound, lengths)
            same_inputs = hf(input_values=read_image(model, sound, lengths)).logits
            own_inputs = hf(input_values=features(folder, alone)).logits
        assert (ours - same_inputs).abs().max().item() <= 1e-5
        assert (ours - own_inputs).abs().max().item() <= 1e-4
        assert (ours[:, 0] - ours[:, 1]).abs().min().item() > 1e-3  # logits that differ: a real check


def test_predict_of_a_wav_gives_transformers_class(tmp_path, folder):
    imported(tmp_path, folder)
    hf = reference(folder)
    for i, sound in enumerate(clips()):
        sf.write(tmp_path / f"{i}.wav", sound.numpy(), RATE, subtype="FLOAT")
    done = run_cli("predict", str(tmp_path / "run"), *(str(tmp_path / f"{i}.wav") for i in range(3)))
    assert done.returncode == 0, done.stderr
    read = [torch.from_numpy(sf.read(tmp_path / f"{i}.wav", dtype="float32")[0]) for i in range(3)]
    with torch.no_grad():
        expected = hf(input_values=features(folder, torch.stack(read))).logits.argmax(-1).tolist()
    assert [line.split("\t")[1] for line in done.stdout.splitlines()] == [LABELS[i] for i in expected]


@pytest.mark.parametrize(
    "config, extractor, message",
    [
        ({"time_stride": 2}, {}, "frequency_stride 3 unlike time_stride 2 (attnlab's patches have one hop)"),
        ({"qkv_bias": False}, {}, "qkv_bias false"),
        ({"layer_norm_eps": 1e-6}, {}, "layer_norm_eps 1e-06 (attnlab's normed head has 1e-12)"),
        ({}, {"max_length": 30}, "max_length 22 unlike the extractor's 30"),
    ],
    ids=["strides", "qkv", "eps", "length"],
)
def test_a_folder_attnlab_cannot_represent_is_refused_in_one_line(tmp_path, config, extractor, message):
    hf = tiny_folder(tmp_path / "hf", config=config, extractor=extractor)
    done = run_cli("import-hf", str(hf), "--out", str(tmp_path / "run"))
    assert done.returncode != 0 and len(done.stderr.splitlines()) == 1, done.stderr
    assert message in done.stderr and not (tmp_path / "run").exists()


# -- a run attnlab trains, out to transformers -------------------------------------------------------

AST_MODEL = {
    "arch": "ast",
    "reads": "window",
    "features": {"n_mels": 16, "filterbank": "kaldi", "scaling": "log", "offset": -4.0, "scale": 9.0},
    "patches": {"size": 4, "hop": 3, "positional": "learned"},
    "classifier": {"pooling": "distilled", "head": "normed"},
    "stack": {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "dropout": 0.0, "layer_norm_eps": 1e-12},
}


def trained(tmp_path: Path, **model: object) -> Path:
    """An ast run trained 2 steps on test_audio_classification.py's tones (8 kHz, read at 16 kHz)."""
    from test_audio_classification import write_tones

    config = {
        "model": AST_MODEL | model,
        "data": {
            "task": "audio_classification",
            "recordings": str(write_tones(tmp_path / "tones", indices=range(5, 12))),
            "sample_rate": RATE,
            "clip_seconds": SAMPLES / RATE,
        },
        "train": {"max_steps": 2, "batch_size": 8, "eval_every": 2, "progress": False},
    }
    (tmp_path / "run.json").write_text(json.dumps(config))
    done = run_cli("train", str(tmp_path / "run.json"), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    return tmp_path / "run"


def test_a_run_trained_by_attnlab_exports_and_transformers_reads_it_the_same(tmp_path):
    run = trained(tmp_path)
    done = run_cli("export-hf", str(run), "--out", str(tmp_path / "hf"))
    assert done.returncode == 0, done.stderr
    model, _, _ = load_run(run)
    sound = clips()
    with torch.no_grad():
        ours = model.eval().classify(sound, torch.full((3,), SAMPLES))
        theirs = reference(tmp_path / "hf")(input_values=kaldi_features(tmp_path / "hf", sound)).logits
        extracted = features(tmp_path / "hf", sound)  # the folder's extractor: the run's features
    assert (ours - theirs).abs().max().item() <= 1e-5
    assert (model.spectrogram.features(sound) - extracted).abs().max().item() <= 1e-4
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["id2label"] == {"0": "0", "1": "1"}


@pytest.mark.parametrize(
    "model, message",
    [
        ({"reads": "clip"}, "reads 'clip' (the AST's is 'window')"),
        ({"classifier": {"pooling": "cls", "head": "normed"}}, "classifier.pooling 'cls' (the AST's is 'distilled')"),
    ],
    ids=["clip", "cls"],
)
def test_an_export_of_options_the_ast_lacks_names_them_in_one_line(tmp_path, model, message):
    run = trained(tmp_path, **model)
    done = run_cli("export-hf", str(run), "--out", str(tmp_path / "hf"))
    assert done.returncode != 0 and len(done.stderr.splitlines()) == 1, done.stderr
    assert message in done.stderr and not (tmp_path / "hf").exists()


def test_the_kaldi_fbank_ignores_what_lies_past_the_last_whole_window():
    """Kaldi's frames are whole windows: samples past the last one change nothing (checked at 1e-7)."""
    from attnlab.nn.spectrogram import KaldiFbank

    x = clips(1)
    longer = torch.cat([x, torch.randn(1, 100)], dim=1)  # 100 samples: less than a hop more
    assert np.allclose(KaldiFbank(n_mels=16)(x).numpy(), KaldiFbank(n_mels=16)(longer).numpy(), atol=1e-7)
