"""`attnlab serve` of the runs that read sound (issue 62): an uploaded recording (a WAV's bytes in base64),
read as `transcribe` and `predict` read files. A speech recogniser's page gives the beam's n-best, which
are `transcribe`'s, with the spectrogram the encoder read and each output digit's cross-attention over
its frame tokens; an audio classifier's gives its classes, which are `predict`'s, and each layer's
summary attention over the tokens that tile the spectrogram (the AST's patches: its class token's rows);
bad uploads are refused in one line. In Chromium, the page draws each digit's cross-attention on the
spectrogram, a pixel's shade the head's weight."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import test_audio_classification as classification
import test_speech_recognition as speech
import torch
from test_serve import answer, browser, client, serving  # noqa: F401  (browser: a fixture)

from attnlab.analysis.capture import capture_attention
from attnlab.runs.checkpoint import load_run

from helpers import run_cli

RATE = 8000


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A tiny recogniser of strings of pips (60 steps) and a tiny AST classifier of tones (2 steps)."""
    root = tmp_path_factory.mktemp("audio")
    (root / "speech.yaml").write_text(speech.RECIPE.format(recordings=speech.write_pips(root / "pips"), steps=60))
    tones = classification.write_tones(root / "tones", indices=range(5, 12))
    (root / "ast.yaml").write_text(
        classification.RECIPE.format(arch="ast", model=classification.AST_MODEL, recordings=tones, steps=2)
    )
    for name in ("speech", "ast"):
        done = run_cli("train", str(root / f"{name}.yaml"), "--out", str(root / name))
        assert done.returncode == 0, done.stderr
    return {"speech": root / "speech", "ast": root / "ast", "root": root}


def pips_wav(path: Path) -> Path:
    """'2 0' as two pips and a silence, a 16-bit WAV."""
    rng = np.random.default_rng(5)
    sf.write(
        path, np.concatenate([speech.pip("2", 0.25, rng), np.zeros(400, np.float32), speech.pip("0", 0.2, rng)]), RATE
    )
    return path


def encoded(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_a_recogniser_transcribes_an_upload_as_transcribe_does_with_each_digits_attention_on_the_spectrogram(
    runs, tmp_path
):
    wav = pips_wav(tmp_path / "a.wav")
    got = answer(client(runs["speech"]), audio=encoded(wav), beam=3)
    lines = run_cli("transcribe", str(runs["speech"]), str(wav), "--beam", "3", "--nbest", "3").stdout.splitlines()
    assert [o["text"] for o in got["outputs"]] == [line.split("\t")[1] for line in lines]
    assert [round(o["score"], 4) for o in got["outputs"]] == [round(float(line.split("\t")[2]), 4) for line in lines]
    frames = sf.info(wav).frames // 80  # the clip's 10 ms frames
    picture = np.array(got["picture"])  # (bands, frames, 1) in [0, 1]
    assert picture.shape == (16, frames, 1) and picture.min() == 0.0 and picture.max() == 1.0
    assert got["grid"] == [1, (frames + 1) // 2] and got["source_tokens"][0] == "0.01 s"
    cross = [m for m in got["attention"] if m["kind"] == "cross"]
    assert cross and all(len(m["cols"]) == got["grid"][1] for m in cross)
    assert [s["token"] for s in got["steps"]] == got["outputs"][0]["tokens"] + ["<eos>"]


def test_an_audio_classifier_gives_predicts_class_and_its_class_tokens_attention_on_the_spectrogram(runs, tmp_path):
    wav = classification.write_tones(tmp_path / "tones", indices=[99])
    wav = next(wav.glob("1_ann_99.wav"))
    got = answer(client(runs["ast"]), audio=encoded(wav))
    predicted = run_cli("predict", str(runs["ast"]), str(wav)).stdout.split("\t")
    assert (
        got["outputs"][0]["label"] == predicted[1]
        and abs(got["outputs"][0]["probability"] - float(predicted[2])) < 1e-4
    )
    model, _, _ = load_run(runs["ast"])
    sound, _ = sf.read(wav, dtype="float32")
    waves = torch.zeros(1, 4000)
    waves[0, : len(sound)] = torch.from_numpy(sound)
    with torch.no_grad(), capture_attention(model.eval()) as captured:
        model.classify(waves, torch.tensor([len(sound)]))
    assert got["grid"] == [4, 12] and np.array(got["picture"]).shape == (16, 48, 1)  # the 48 frames 12 patches cover
    drawn = {m["module"]: torch.tensor(m["probs"]) for m in got["summary"]}
    for name, record in captured.last().items():  # the class token's row, the bands' order flipped
        expected = record.probs[0, :, 0, 1:].unflatten(-1, (4, 12)).flip(-2).flatten(-2)
        assert torch.allclose(drawn[record.module], expected, atol=1e-6), name


@pytest.mark.parametrize(
    "run, request_, status, message",
    [
        ("speech", {"audio": "***"}, 400, "audio must be an audio file's bytes in base64"),
        (
            "speech",
            {"audio": base64.b64encode(b"not a sound").decode()},
            400,
            "the uploaded recording: not an audio file",
        ),
        (
            "ast",
            {"audio": ""},
            400,
            "the input is empty; upload a recording, or give an audio file's path on the server",
        ),
        ("ast", {"audio": "", "text": "a.wav"}, 403, "this server reads no files; upload the recording"),
        ("speech", "long", 413, "the recording is 3.00 s; this model reads at most 2 s"),
    ],
    ids=["base64", "not-audio", "empty", "file", "long"],
)
def test_a_bad_upload_is_refused_in_one_line(runs, run, request_, status, message):
    if request_ == "long":
        data = io.BytesIO()
        sf.write(data, np.full(3 * RATE, 0.1, np.float32), RATE, format="WAV")
        request_ = {"audio": base64.b64encode(data.getvalue()).decode()}
    reply = client(runs[run]).post("/api/run", json=request_)
    assert reply.status_code == status and message in reply.json()["error"], reply.text
    assert "\n" not in reply.json()["error"]


def test_the_page_transcribes_an_uploaded_recording_and_draws_each_digits_attention_on_the_spectrogram(
    browser,  # noqa: F811  (the fixture imported above)
    runs,
    tmp_path,
):
    wav = pips_wav(tmp_path / "a.wav")
    expected = answer(client(runs["speech"]), audio=encoded(wav), beam=4)
    with serving(runs["speech"]) as url:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(url)
        page.wait_for_selector("#upload", state="visible")  # shown once /api/info has named a run of recordings
        assert page.get_attribute("#upload", "accept") == "audio/*"
        page.set_input_files("#upload", str(wav))
        page.click("button[type=submit]")
        page.wait_for_selector(".panel[data-run='0'][data-state=ready]")
        assert page.locator(".nbest li .text").all_inner_texts() == [
            o["text"] or "(empty)" for o in expected["outputs"]
        ]
        last = len(expected["steps"]) - 1
        page.click(f".tok[data-step='{last}']")
        cross = next(m for m in expected["attention"] if m["kind"] == "cross")
        weights = cross["probs"][1][last]  # head 1's weights for the last step over the frame tokens
        bands, frames = len(expected["picture"]), len(expected["picture"][0])
        tokens = expected["grid"][1]
        pixel = (
            """([x, y]) => { const c = document.querySelector('canvas.patches[data-head="1"]'), s = c.width / %d;
            return Array.from(c.getContext('2d').getImageData(x * s, y * s, 1, 1).data); }"""
            % frames
        )
        for token in range(tokens):  # on the grey picture, red - blue = 0.75 (252 - 40) w / max w: the weight drawn
            x = (2 * token * frames + frames) // (2 * tokens)  # inside the token's columns
            red, _, blue, _ = page.evaluate(pixel, [x, bands // 2])
            assert abs((red - blue) - 0.75 * 212 * weights[token] / max(weights)) <= 1.5, token
