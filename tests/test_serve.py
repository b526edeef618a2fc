"""`attnlab serve`: the JSON API against the analysis code it stands on, and the page in a real browser.

The API's numbers are checked against the library run directly on the same input: attention maps
against ``capture_attention`` / ``attention_of``, outputs against the searches (or a plain argmax
loop), and heads switched off against the model with those heads cut out of its weights
(``remove_heads``, the prune code). The browser test drives Debian's Chromium with Playwright
against `attnlab serve` started as a real process, and saves a screenshot (copied to
docs/images/serve.png when ATTNLAB_UPDATE_SCREENSHOT=1).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from starlette.testclient import TestClient

from attnlab.analysis.capture import attention_of, capture_attention
from attnlab.analysis.cross_modal import blocks
from attnlab.analysis.heads import head_entropy
from attnlab.analysis.prune import prune_run
from attnlab.config import overlaid
from attnlab.data.batching import source_batch
from attnlab.data.tokenizers import BOS, EOS, PAD
from attnlab.decode.search import beam_search
from attnlab.nn.attention import remove_heads
from attnlab.runs.checkpoint import load_run
from attnlab.runs.config import RunConfig
from attnlab.runs.run_dir import RunDir
from attnlab.serve.app import create_app
from attnlab.serve.explorer import Explorer
from attnlab.tasks.visual_qa import ask
from attnlab.train.run import train_run

from helpers import ATTNLAB, run_cli

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
SENTENCE = "3 1 4 1 5"


def trained(root: Path, name: str, model: dict, data: dict, steps: int = 2, **train) -> Path:
    """A run directory of ``steps`` updates: enough weights to read, in a second or two. On one
    thread: models this small gain nothing from more, and lose much to them on a busy machine."""
    cfg = RunConfig.from_sections(
        {
            "model": overlaid({"stack": {"dropout": 0.0}}, model),
            "data": data,
            "train": {
                "max_steps": steps,
                "eval_every": steps,
                "lr_schedule": "constant",
                "warmup_steps": 1,
                "progress": False,
                **train,
            },
        }
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_run(cfg, root / name, log=lambda line: None)
    finally:
        torch.set_num_threads(threads)
    return root / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A translation run (the built-in reverse task), the same run with a quarter of its heads pruned
    by `attnlab prune`, a character LM, a classifier, a masked LM, a ViT on the digits, a
    captioner and a single-stream question answerer on the scenes."""
    root = tmp_path_factory.mktemp("serve")
    (root / "text.txt").write_text("the cat sat on the mat.\n" * 40)
    (root / "labelled.tsv").write_text(
        "".join(
            f"{w} film\t{label}\n"
            for w, label in [("great", "pos"), ("awful", "neg"), ("fine", "pos"), ("dull", "neg")] * 10
        )
    )
    small = {"stack": {"d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32}}
    out = {
        "translation": trained(
            root,
            "reverse",
            {
                "stack": {"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "norm": "pre"},
                "positions": {"max_len": 32},
            },
            {
                "format": "builtin",
                "generator": {"name": "reverse", "min_len": 3, "max_len": 5},
                "text": {"tokenizer": "word"},
                "n_train": 1000,
                "n_valid": 8,
                "n_test": 8,
            },
            steps=200,
            max_tokens=400,
            lr=0.01,
            eval_exact_match=8,
        )
    }  # reverses SENTENCE
    prune_run(out["translation"], [0.25], out=root / "reverse-pruned")
    out["pruned"] = root / "reverse-pruned"
    out["lm"] = trained(
        root,
        "lm",
        {"arch": "decoder_lm", "positions": {"scheme": "learned", "max_len": 32}, **small},
        {"format": "text", "train": str(root / "text.txt"), "text": {"tokenizer": "char"}, "block_size": 16},
        batch_size=4,
    )
    encoder = {"arch": "encoder_only", "positions": {"scheme": "learned", "max_len": 16}, **small}
    out["classifier"] = trained(
        root,
        "classifier",
        encoder,
        {"task": "classification", "train": str(root / "labelled.tsv"), "splits": {"n_valid": 8}, "max_len": 16},
        max_tokens=256,
    )
    out["mlm"] = trained(
        root,
        "mlm",
        encoder,
        {"task": "masked_lm", "train": str(root / "text.txt"), "splits": {"n_valid": 8}, "max_len": 16},
        max_tokens=256,
    )
    out["vit"] = trained(
        root,
        "vit",
        {"arch": "vit", "patches": {"size": 2}, "stack": {"d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32}},
        {"task": "image_classification", "images": {"dataset": "digits"}},
        batch_size=32,
    )
    out["captioner"] = trained(
        root,
        "captioner",
        {
            "arch": "captioner",
            "patches": {"size": 8},
            "stack": {"d_model": 16, "n_heads": 2, "d_ff": 32},
            "depths": {"encoder": 1, "decoder": 1},
        },
        {
            "task": "captioning",
            "images": {"dataset": "scenes"},
            "scenes": {"max_objects": 1},
            "splits": {"n_train": 256, "n_valid": 8, "n_test": 8},
        },
        steps=40,
        batch_size=32,
        lr=0.01,
    )
    out["qa"] = trained(
        root,
        "qa",
        {"arch": "single_stream", "patches": {"size": 8}, **small},
        {"task": "visual_qa", "scenes": {"max_objects": 1}, "splits": {"n_train": 64, "n_valid": 8, "n_test": 8}},
        steps=20,
        batch_size=32,
        lr=0.01,
    )
    return out


def client(*run_dirs: Path, allow_files: bool = False) -> TestClient:
    return TestClient(create_app([Explorer(r, allow_files=allow_files) for r in run_dirs]), base_url="http://127.0.0.1")


def answer(api: TestClient, **request) -> dict:
    reply = api.post("/api/run", json=request)
    assert reply.status_code == 200, reply.text
    return reply.json()


def assert_maps_equal(maps: list[dict], records: dict, heads_off: dict[str, list[int]] | None = None) -> None:
    """The API's maps are the records' weights (1e-6), less the heads switched off, which the
    model ``records`` came from has cut out; and the entropies are those of the maps."""
    assert sorted(m["module"] for m in maps) == sorted(records)
    for m in maps:
        probs = torch.tensor(m["probs"], dtype=torch.float64)  # (H, Tq, Tk)
        assert (len(m["rows"]), len(m["cols"])) == probs.shape[1:]
        kept = [h for h in range(probs.shape[0]) if h not in (heads_off or {}).get(m["module"], [])]
        torch.testing.assert_close(probs[kept], records[m["module"]].probs[0].double(), atol=1e-6, rtol=0)
        torch.testing.assert_close(torch.tensor(m["entropy"]), head_entropy(probs[None].float()), atol=1e-5, rtol=0)


def cut(run: Path, heads: dict[str, list[int]]):
    """The run's model with ``heads`` removed from its weights, and its tokenizers."""
    model, tokenizers, _ = load_run(run)
    remove_heads(model, heads)
    return model, tokenizers


# -- the JSON API, family by family ------------------------------------------------------------------


def test_translation_gives_the_beams_n_best_and_the_maps_of_the_chosen_hypothesis(runs):
    api = client(runs["translation"])
    model, tokenizers, _ = load_run(runs["translation"])
    src = source_batch([tokenizers["src"].encode(SENTENCE)])
    hyps = beam_search(model, src, beam=3, nbest=3)[0]
    for chosen in (0, 2):
        got = answer(api, text=SENTENCE, beam=3, hypothesis=chosen)
        assert [o["text"] for o in got["outputs"]] == [tokenizers["tgt"].decode(h.tokens) for h in hyps]
        assert [o["score"] for o in got["outputs"]] == pytest.approx([h.normalized for h in hyps], abs=1e-6)
        assert [o["logprob"] for o in got["outputs"]] == pytest.approx([h.score for h in hyps], abs=1e-6)
        tokens = hyps[chosen].tokens
        assert_maps_equal(got["attention"], attention_of(model, src, torch.tensor([[BOS] + tokens])))
        assert got["source_tokens"] == [*SENTENCE.split(), "<eos>"]
        assert got["target_tokens"] == [*tokenizers["tgt"].id_tokens(tokens), "<eos>"]
        # the chosen hypothesis token by token: its log-probabilities add up to the beam's score
        assert [s["token"] for s in got["steps"]] == got["target_tokens"]
        assert sum(s["logprob"] for s in got["steps"]) == pytest.approx(hyps[chosen].score, abs=1e-5)
    cross = next(m for m in got["attention"] if m["kind"] == "cross")
    assert (cross["rows"], cross["cols"]) == (got["target_tokens"], got["source_tokens"])
    assert [m["module"] for m in got["attention"]] == [
        "encoder.layers.0.self_attn",
        "encoder.layers.1.self_attn",
        "decoder.layers.0.self_attn",
        "decoder.layers.1.self_attn",
        "decoder.layers.0.cross_attn",
        "decoder.layers.1.cross_attn",
    ]


def test_heads_switched_off_give_what_the_model_with_those_heads_cut_out_gives(runs):
    api = client(runs["translation"])
    off = {"encoder.layers.1.self_attn": [1], "decoder.layers.0.cross_attn": [0, 2]}
    before = answer(api, text=SENTENCE, beam=3)
    got = answer(api, text=SENTENCE, beam=3, heads_off=off)
    model, tokenizers = cut(runs["translation"], off)
    src = source_batch([tokenizers["src"].encode(SENTENCE)])
    hyps = beam_search(model, src, beam=3, nbest=3)[0]
    assert got["heads_off"] == off
    assert [o["text"] for o in got["outputs"]] == [tokenizers["tgt"].decode(h.tokens) for h in hyps]
    assert [o["score"] for o in got["outputs"]] == pytest.approx([h.normalized for h in hyps], abs=1e-5)
    assert got["outputs"][0]["score"] != pytest.approx(before["outputs"][0]["score"], abs=1e-3)
    assert_maps_equal(got["attention"], attention_of(model, src, torch.tensor([[BOS] + hyps[0].tokens])), off)
    assert answer(api, text=SENTENCE, beam=3) == before  # the gates last one request


def test_a_language_model_continues_greedily_and_by_seeded_sampling(runs):
    api = client(runs["lm"])
    off = {"decoder.layers.0.self_attn": [1]}
    for heads_off in ({}, off):
        got = answer(api, text="the cat", max_new_tokens=8, heads_off=heads_off)
        model, tokenizers = cut(runs["lm"], heads_off)
        ids = tokenizers["tgt"].encode("the cat")
        new, logprob = [], 0.0
        with torch.no_grad():
            for _ in range(8):  # the argmax, one full pass per token
                logprobs = model(torch.tensor([ids + new]))[0, -1].log_softmax(-1)
                logprobs[[PAD, BOS]] = -torch.inf
                token = int(logprobs.argmax())
                if token == EOS:
                    break
                new, logprob = new + [token], logprob + float(logprobs[token])
        assert got["outputs"][0]["text"] == tokenizers["tgt"].decode(new)
        assert got["outputs"][0]["logprob"] == pytest.approx(logprob, abs=1e-5)
        assert [s["logprob"] for s in got["steps"]] == pytest.approx(
            [float(lp) for lp in _step_logprobs(model, ids, new)], abs=1e-5
        )
        assert_maps_equal(got["attention"], attention_of(model, None, torch.tensor([ids + new])), heads_off)
    drawn = [
        answer(api, text="the cat", max_new_tokens=8, sample=True, temperature=1.5, seed=seed)["outputs"][0]["text"]
        for seed in (1, 1, 2)
    ]
    assert drawn[0] == drawn[1]  # a seed draws the same text again
    positions = 32  # the model's max_len: the maps cover prompt + continuation, so the continuation stops there
    assert len(answer(api, text="a" * 30, max_new_tokens=8)["attention"][0]["rows"]) <= positions


def _step_logprobs(model, prompt: list[int], new: list[int]) -> list[float]:
    with torch.no_grad():
        logprobs = model(torch.tensor([prompt + new]))[0].log_softmax(-1)  # (T, V)
    return [logprobs[len(prompt) - 1 + t, token] for t, token in enumerate(new)]


def test_a_classifier_gives_its_class_probabilities_and_its_encoders_maps(runs):
    api = client(runs["classifier"])
    off = {"encoder.layers.0.self_attn": [0]}
    for heads_off in ({}, off):
        got = answer(api, text="great film", heads_off=heads_off)
        model, tokenizers = cut(runs["classifier"], heads_off)
        ids = torch.tensor([[BOS, *tokenizers["src"].encode("great film"), EOS]])
        with capture_attention(model) as captured:
            p = model.classify(ids, torch.zeros_like(ids))[0].softmax(-1)
        labels = json.loads((runs["classifier"] / "task_state.json").read_text())["labels"]
        assert {o["label"]: o["probability"] for o in got["outputs"]} == pytest.approx(
            dict(zip(labels, p.tolist())), abs=1e-6
        )
        assert [o["probability"] for o in got["outputs"]] == sorted(p.tolist(), reverse=True)
        assert got["source_tokens"] == ["<bos>", "great", "film", "<eos>"]
        assert_maps_equal(got["attention"], captured.last(), heads_off)


def test_a_masked_lm_shows_its_encoders_maps(runs):
    got = answer(client(runs["mlm"]), text="the cat sat")
    model, tokenizers, _ = load_run(runs["mlm"])
    ids = torch.tensor([[BOS, *tokenizers["src"].encode("the cat sat"), EOS]])
    with capture_attention(model) as captured:
        model(ids)
    assert got["outputs"] == [] and len(got["attention"]) == 2
    assert_maps_equal(got["attention"], captured.last())


def test_an_image_model_reads_an_image_file_only_when_files_are_allowed(runs, tmp_path):
    from sklearn.datasets import load_digits

    pixels = (load_digits().images[0] * 255 / 16).astype(np.uint8)  # (8, 8) grey
    Image.fromarray(pixels).save(tmp_path / "digit.png")
    refused = client(runs["vit"]).post("/api/run", json={"text": str(tmp_path / "digit.png")})
    assert refused.status_code == 403 and "--allow-files" in refused.json()["error"]
    api = client(runs["vit"], allow_files=True)
    missing = api.post("/api/run", json={"text": str(tmp_path / "none.png")})
    assert missing.status_code == 400 and missing.json()["error"] == f"{tmp_path / 'none.png'}: no such file"
    got = answer(api, text=str(tmp_path / "digit.png"))
    model, _, _ = load_run(runs["vit"])
    state = json.loads((runs["vit"] / "task_state.json").read_text())
    x = (torch.tensor(pixels, dtype=torch.float32)[None, None] - state["mean"][0]) / state["std"][0]
    with capture_attention(model) as captured:
        p = model.classify(x)[0].softmax(-1)
    assert {o["label"]: o["probability"] for o in got["outputs"]} == pytest.approx(
        dict(zip(state["labels"], p.tolist())), abs=1e-5
    )
    assert got["source_tokens"][:3] == ["<cls>", "(0,0)", "(0,1)"] and len(got["source_tokens"]) == 1 + 16
    assert_maps_equal(got["attention"], captured.last())


def scene_png(path: Path) -> tuple[Path, torch.Tensor, np.ndarray]:
    """A one-object scene written as a PNG, its (1, C, H, W) pixels as a tensor, and as drawn (H, W, C)."""
    from attnlab.data.scenes import generate

    pixels = generate("test", 1, seed=0, max_objects=1)[0].pixels
    Image.fromarray(pixels).save(path)
    return path, torch.tensor(pixels).permute(2, 0, 1).float()[None], pixels


def test_a_captioner_captions_an_uploaded_image_with_each_words_attention_over_the_patches(runs, tmp_path):
    """An upload (or, with --allow-files, a path): the beam's n-best as beam_search gives them, the
    maps of a teacher-forced pass over the chosen caption, cross-attention rows the caption's words
    and columns the 4x4 patches, and the picture the model read."""
    path, x, pixels = scene_png(tmp_path / "scene.png")
    state = json.loads((runs["captioner"] / "task_state.json").read_text())
    x = (x - torch.tensor(state["mean"])[:, None, None]) / torch.tensor(state["std"])[:, None, None]
    model, tokenizers, cfg = load_run(runs["captioner"])
    hyps = beam_search(model, x, beam=3, nbest=3, max_len=cfg.positions.max_len - 1)[0]
    upload = base64.b64encode(path.read_bytes()).decode()
    got = answer(client(runs["captioner"]), image=upload, beam=3, hypothesis=1)
    assert [o["text"] for o in got["outputs"]] == [tokenizers["tgt"].decode(h.tokens) for h in hyps]
    assert [o["score"] for o in got["outputs"]] == pytest.approx([h.normalized for h in hyps], abs=1e-6)
    chosen = hyps[1].tokens
    assert_maps_equal(got["attention"], attention_of(model, x, torch.tensor([[BOS] + chosen])))
    assert sum(s["logprob"] for s in got["steps"]) == pytest.approx(hyps[1].score, abs=1e-5)
    cross = next(m for m in got["attention"] if m["kind"] == "cross")
    assert cross["rows"] == [*tokenizers["tgt"].id_tokens(chosen), "<eos>"] and cross["cols"][:2] == ["(0,0)", "(0,1)"]
    assert got["grid"] == [4, 4] and len(cross["cols"]) == 16
    np.testing.assert_allclose(np.array(got["picture"]), pixels / 255.0, atol=1e-5)
    refused = client(runs["captioner"]).post("/api/run", json={"text": str(path)})
    assert refused.status_code == 403 and "--allow-files" in refused.json()["error"]
    assert answer(client(runs["captioner"], allow_files=True), text=str(path), beam=3, hypothesis=1) == got


@pytest.mark.parametrize(
    "request_, message",
    [
        ({"image": "not base64!"}, "image must be an image file's bytes in base64"),
        ({"image": base64.b64encode(b"not a png").decode()}, "the uploaded image: not an image that Pillow can decode"),
        ({"image": "", "text": ""}, "the input is empty; upload an image, or give an image file's path on the server"),
        ({"image": base64.b64encode(b"x").decode(), "text": "scene.png"}, "an image file's path, not both"),
    ],
)
def test_a_bad_image_is_refused_in_one_line(runs, request_, message):
    reply = client(runs["captioner"], allow_files=True).post("/api/run", json=request_)
    assert reply.status_code == 400 and reply.json()["error"].endswith(message) and "\n" not in reply.json()["error"]


QUESTION = "what colour is the object?"


def test_a_question_answerer_answers_as_ask_does_with_each_words_attention_over_the_patches(runs, tmp_path):
    """An upload (or, with --allow-files, a path) and a question: every answer's probability as
    `ask` gives it, the maps of the joint sequence [question; patches], and each layer's
    text-to-image block as analysis/cross_modal.py cuts it, rows the [CLS] and the question's words."""
    path, x, pixels = scene_png(tmp_path / "scene.png")
    model, tokenizers, cfg = load_run(runs["qa"])
    state = json.loads((runs["qa"] / "task_state.json").read_text())
    [expected] = ask(model, RunDir(runs["qa"]), [str(path)], QUESTION)
    got = answer(client(runs["qa"]), image=base64.b64encode(path.read_bytes()).decode(), question=QUESTION)
    assert {o["label"]: o["probability"] for o in got["outputs"]} == pytest.approx(
        dict(zip(state["labels"], expected)), abs=1e-6
    )
    assert [o["probability"] for o in got["outputs"]] == pytest.approx(sorted(expected, reverse=True), abs=1e-6)
    x = (x - torch.tensor(state["mean"])[:, None, None]) / torch.tensor(state["std"])[:, None, None]
    ids = torch.tensor([[BOS, *tokenizers["src"].encode(QUESTION), EOS]])
    with torch.no_grad(), capture_attention(model) as captured:
        model.classify(x, ids)
    records, modality = captured.last(), model.sequence(x, ids)[2]
    assert_maps_equal(got["attention"], records)
    words = ["[CLS]", *tokenizers["src"].id_tokens(ids[0, 1:].tolist())]
    assert got["question_tokens"] == words and got["grid"] == [4, 4] and len(got["text_to_image"]) == cfg.stack.n_layers
    for block in got["text_to_image"]:
        assert block["rows"] == words and block["cols"] == cfg.patches.labels(RunDir(runs["qa"]).read_shape())
        torch.testing.assert_close(
            torch.tensor(block["probs"], dtype=torch.float64),
            blocks(records[block["module"]].probs[0], modality)["text_to_image"].double(),
            atol=1e-6,
            rtol=0,
        )
    np.testing.assert_allclose(np.array(got["picture"]), pixels / 255.0, atol=1e-5)
    assert answer(client(runs["qa"], allow_files=True), text=str(path), question=QUESTION) == got


@pytest.mark.parametrize(
    "run, request_, status, message",
    [
        (
            "qa",
            {"image": base64.b64encode(b"not a png").decode(), "question": QUESTION},
            400,
            "the uploaded image: not an image that Pillow can decode",
        ),
        (
            "qa",
            {"image": base64.b64encode(b"x").decode(), "question": "  "},
            400,
            'the question is empty; ask something about the image, e.g. "how many circles?"',
        ),
        (
            "qa",
            {"image": base64.b64encode(b"x").decode(), "question": "what " * 17},
            413,
            "the input has 17 tokens; this model reads at most 16",
        ),
        (
            "captioner",
            {"image": base64.b64encode(b"x").decode(), "question": QUESTION},
            400,
            "captioner is a captioning run, which answers no question; ask a visual_qa run",
        ),
    ],
)
def test_a_bad_question_or_image_is_refused_in_one_line(runs, run, request_, status, message):
    reply = client(runs[run]).post("/api/run", json=request_)
    assert reply.status_code == status and reply.json()["error"].endswith(message)
    assert "\n" not in reply.json()["error"]


def test_the_text_only_baseline_answers_with_no_patches_to_draw(runs, tmp_path):
    """image_tokens: none reads the question alone: its maps are the question's, its text-to-image
    blocks empty, and its answers `ask`'s."""
    run = trained(
        tmp_path,
        "text-only",
        {
            "arch": "single_stream",
            "patches": {"size": 8},
            "image_tokens": "none",
            "stack": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
        },
        {"task": "visual_qa", "scenes": {"max_objects": 1}, "splits": {"n_train": 32, "n_valid": 8, "n_test": 8}},
        batch_size=32,
    )
    path, _, _ = scene_png(tmp_path / "scene.png")
    got = answer(client(run), image=base64.b64encode(path.read_bytes()).decode(), question=QUESTION)
    [expected] = ask(load_run(run)[0], RunDir(run), [str(path)], QUESTION)
    state = json.loads((run / "task_state.json").read_text())
    assert {o["label"]: o["probability"] for o in got["outputs"]} == pytest.approx(
        dict(zip(state["labels"], expected)), abs=1e-6
    )
    [block] = got["text_to_image"]
    assert got["source_tokens"] == got["question_tokens"] and block["cols"] == []
    assert np.array(block["probs"]).shape == (2, len(got["question_tokens"]), 0)


def test_info_describes_each_run_and_a_pruned_runs_report(runs):
    info = client(runs["translation"], runs["pruned"]).get("/api/info").json()
    whole, pruned = info["runs"]
    cut_out = json.loads((runs["pruned"] / "pruned_heads.json").read_text())
    assert whole["pruning"] is None and pruned["pruning"]["pruned_heads"] == cut_out
    assert pruned["pruning"]["heads_pruned"] == 6 and pruned["pruning"]["heads_total"] == 24
    assert sum(pruned["modules"].values()) == sum(whole["modules"].values()) - 6 == 18
    assert all(pruned["modules"][m] == 4 - len(cut_out.get(m, [])) for m in whole["modules"])
    assert info["limits"]["max_chars"] == 1000 and whole["options"] == {"beam": 4, "lenpen": 0.6, "hypothesis": 0}


def test_the_page_opens_on_an_example_from_each_runs_validation_data(runs):
    """The first validation source of a translation run, the first validation text of a classifier,
    the start of a language model's validation text; none where the input is no sentence (an image)
    or the run's data is not there any more."""
    from attnlab.runs.data import read_run_data
    from attnlab.runs.run_dir import RunDir

    examples = {
        name: r["example"]
        for name, r in zip(
            ("translation", "lm", "classifier", "mlm", "vit"),
            client(runs["translation"], runs["lm"], runs["classifier"], runs["mlm"], runs["vit"])
            .get("/api/info")
            .json()["runs"],
        )
    }
    valid = read_run_data(RunDir(runs["translation"]), "valid").splits["valid"]
    assert examples["translation"] == valid[0].src and len(examples["translation"].split()) >= 3
    assert examples["lm"] == "the cat sat on the mat."  # the text's lines, one whole line first
    assert examples["classifier"] in {"great film", "awful film", "fine film", "dull film"}
    assert examples["mlm"] is None and examples["vit"] is None
    moved = runs["lm"].parent / "lm-moved-data"
    shutil.copytree(runs["lm"], moved)
    config = moved / "config.yaml"
    config.write_text(config.read_text().replace(str(runs["lm"].parent / "text.txt"), str(moved / "gone.txt")))
    assert Explorer(moved).info()["example"] is None


# -- bad input: one line each, and the server goes on --------------------------------------------------


@pytest.mark.parametrize(
    "request_, status, message",
    [
        ({"text": "1 " * 501}, 413, "the input has 1,002 characters; the explorer takes at most 1,000"),
        ({"text": " ".join(["1"] * 70)}, 413, "the input has 70 tokens; this model reads at most 31"),
        ({"text": "   "}, 400, "the input is empty; type a sentence"),
        ({"text": SENTENCE, "beam": 99}, 400, "beam must be between 1 and 16 (got 99)"),
        ({"text": SENTENCE, "beam": "4"}, 400, 'beam must be int (got "4")'),
        ({"text": SENTENCE, "colour": 1}, 400, "unknown field 'colour'; a translation run reads run, text, heads_off"),
        ({"text": SENTENCE, "heads_off": {"encoder.layers.9.self_attn": [0]}}, 400, "heads_off: no attention module"),
        (
            {"text": SENTENCE, "heads_off": {"encoder.layers.0.self_attn": [4]}},
            400,
            "list of head indices 0..3 (got [4])",
        ),
        ({"text": SENTENCE, "run": 1}, 400, "run must be the index of a served run, 0..0 (got 1)"),
    ],
)
def test_a_bad_request_is_refused_in_one_line_and_the_server_goes_on(runs, request_, status, message):
    api = client(runs["translation"])
    reply = api.post("/api/run", json=request_)
    assert reply.status_code == status and message in reply.json()["error"]
    assert "\n" not in reply.json()["error"]
    assert answer(api, text=SENTENCE, beam=2)["outputs"]


def test_bodies_over_the_limit_or_not_json_and_foreign_hosts_are_refused(runs):
    api = client(runs["translation"])
    big = api.post(
        "/api/run", content=b'{"text": "' + b"1" * 70_000 + b'"}', headers={"Content-Type": "application/json"}
    )
    assert big.status_code == 413 and big.json() == {"error": "the request body is over the limit of 65,536 bytes"}
    form = api.post("/api/run", data={"text": SENTENCE})  # what a form on another site can send
    assert form.status_code == 415 and "Content-Type: application/json" in form.json()["error"]
    assert api.post("/api/run", content=b"[1]", headers={"Content-Type": "application/json"}).status_code == 400
    assert api.get("/api/info", headers={"Host": "attacker.example"}).status_code == 400  # DNS rebinding
    assert api.get("/api/run").status_code == 405 and api.get("/static/../explorer.py").status_code == 404
    page = api.get("/")
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]


def test_a_directory_that_is_not_a_run_is_one_line(tmp_path):
    done = run_cli("serve", str(tmp_path), "--port", "0")
    assert done.returncode == 5 and done.stdout == ""
    assert done.stderr == f"error: {tmp_path}: not a run directory (no config.yaml)\n"


def test_a_run_without_attention_weights_is_one_line(runs, tmp_path):
    model = {
        "arch": "decoder_lm",
        "stack": {"attention_backend": "linear", "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
    }
    data = {
        "format": "text",
        "train": str(runs["lm"].parent / "text.txt"),
        "text": {"tokenizer": "char"},
        "block_size": 16,
    }
    run = trained(tmp_path, "linear", model, data, batch_size=4)
    done = run_cli("serve", str(run), "--port", "0")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith(f"error: {run}: decoder.layers.0.self_attn: attention backend 'linear' does not form")


def test_a_port_in_use_is_one_line(runs):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_cli("serve", str(runs["translation"]), "--port", str(port))
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr == f"error: port {port} on 127.0.0.1 is in use; stop what listens there, or choose another --port\n"
    )


# -- the real server, and the page in a real browser -----------------------------------------------------


@contextlib.contextmanager
def serving(*run_dirs: Path):
    """`attnlab serve RUN ... --port 0` as a process: its URL; stopped with Ctrl-C (SIGINT), which
    it reports as every command does (exit status 130, no traceback)."""
    process = subprocess.Popen(
        [*ATTNLAB, "serve", *map(str, run_dirs), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()  # "attnlab explorer on http://127.0.0.1:PORT/ (...); Ctrl-C stops it"
    assert line.startswith("attnlab explorer on http://127.0.0.1:"), line + process.stderr.read()
    yield line.split()[3]
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 130
    assert process.stderr.read() == "\ninterrupted\n"


@pytest.fixture(scope="module")
def server(runs):
    """The translation run and its pruned copy, served side by side."""
    with serving(runs["translation"], runs["pruned"]) as url:
        yield url


def test_the_server_answers_413_to_an_over_long_body_and_stays_up(server):
    request = urllib.request.Request(
        server + "api/run",
        data=json.dumps({"text": "1 " * 40_000}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 413 and "over the limit" in json.loads(refused.value.read())["error"]
    with urllib.request.urlopen(server + "api/info", timeout=30) as reply:
        assert [r["name"] for r in json.loads(reply.read())["runs"]] == ["reverse", "reverse-pruned"]


@pytest.fixture
def browser():
    """Debian's Chromium, headless, driven by Playwright, with a fresh profile and no network use."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make install` (it installs Debian's chromium package)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield browser
        browser.close()


def test_the_form_takes_input_once_the_page_has_its_runs(server, browser, runs):
    """The page writes the first run's example into the text field when /api/info answers, and only
    then enables the field and Run. Enabled from the start, the field took a fill in two steps that
    could straddle that write (select the empty field; the example written; the text inserted after
    it), and the page asked for 'f c t x3 1 4 1 5': the page-score test's failures in full runs."""
    page = browser.new_page()
    page.route("**/api/info", lambda route: route.abort())  # the page never learns its runs
    page.goto(server)
    page.wait_for_selector("#error", state="visible")
    assert page.inner_text("#error").startswith("cannot start")
    assert page.is_disabled("#text") and page.is_disabled("#ask button[type=submit]")
    example = client(runs["translation"]).get("/api/info").json()["runs"][0]["example"]
    page = browser.new_page()
    page.goto(server)
    page.wait_for_selector("#text:enabled")
    assert page.input_value("#text") == example != SENTENCE  # written before the field takes input
    page.fill("#text", SENTENCE)
    assert page.input_value("#text") == SENTENCE


def test_the_page_draws_every_head_and_switching_one_off_changes_the_score(server, browser, runs, tmp_path):
    api = client(runs["translation"], runs["pruned"])
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.goto(server)
    page.fill("#text", SENTENCE)
    page.fill("#options [name=beam]", "3")
    page.click("button[type=submit]")
    for run in (0, 1):
        page.wait_for_selector(f".panel[data-run='{run}'][data-state=ready]")
    expected = [answer(api, text=SENTENCE, beam=3, run=run) for run in (0, 1)]
    for run, got in enumerate(expected):  # every layer x head of every module, as a heatmap with its labels
        panel = f".panel[data-run='{run}']"
        assert page.locator(f"{panel} canvas.heatmap").count() == sum(len(m["probs"]) for m in got["attention"])
        assert page.locator(f"{panel} button.head").count() == sum(len(m["probs"]) for m in got["attention"])
        assert page.locator(f"{panel} .nbest li .score").all_inner_texts() == [
            f"score {o['score']:.4f}" for o in got["outputs"]
        ]
    assert page.locator(".panel[data-run='0'] canvas.heatmap").count() == 24
    assert page.locator(".panel[data-run='1'] canvas.heatmap").count() == 18
    assert "pruned: 6 of 24 heads cut out" in page.inner_text(".panel[data-run='1'] details.pruning")
    drawn = page.evaluate("""() => { const c = document.querySelector('canvas.heatmap');
        const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let inked = 0; for (let i = 0; i < px.length; i += 4) if (px[i] < 250) inked++; return [c.width, inked]; }""")
    assert drawn[0] > 60 and drawn[1] > 100  # labels and cells, not a blank canvas
    first = page.locator("canvas.heatmap").first  # encoder layer 0, head 0: its last cell holds the value shown
    box = first.bounding_box()
    first.hover(position={"x": box["width"] - 5, "y": box["height"] - 5})
    corner = expected[0]["attention"][0]
    assert page.inner_text("#tip") == f"{corner['rows'][-1]} → {corner['cols'][-1]}: {corner['probs'][0][-1][-1]:.4f}"
    # step through the chosen hypothesis: a token's log-probability and its cross-attention
    page.click(".panel[data-run='0'] .tok[data-step='1']")
    step = expected[0]["steps"][1]
    assert f"“{step['token']}”, log P {step['logprob']:.4f}" in page.inner_text(".panel[data-run='0'] .step")
    assert page.locator(".panel[data-run='0'] .align").count() == 2  # one per cross-attention layer
    # switch a head off: the page asks again, and shows what the API gives with that head off
    off = {"decoder.layers.0.cross_attn": [0]}
    head = ".panel[data-run='0'] button.head[data-module='decoder.layers.0.cross_attn'][data-head='0']"
    page.click(head)
    page.wait_for_selector(".panel[data-run='0'][data-answers='2'][data-state=ready]")
    masked = answer(api, text=SENTENCE, beam=3, heads_off=off)
    scores = page.locator(".panel[data-run='0'] .nbest li .score").all_inner_texts()
    assert scores == [f"score {o['score']:.4f}" for o in masked["outputs"]]
    assert scores[0] != f"score {expected[0]['outputs'][0]['score']:.4f}"
    assert "off" in page.get_attribute(head, "class")
    shot = tmp_path / "serve.png"
    page.screenshot(path=str(shot), full_page=True)
    width, height = Image.open(shot).size
    assert width == 1500 and height > 1500  # both columns, down to the last module's maps
    if os.environ.get("ATTNLAB_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "images" / "serve.png")
    # an over-long input: a message on the page, and the server still answers the next one
    page.fill("#text", "1 " * 600)
    page.click("button[type=submit]")
    page.wait_for_selector(".panel[data-run='0'][data-state=error]")
    assert "the explorer takes at most 1,000" in page.inner_text(".panel[data-run='0'] .error")
    page.fill("#text", SENTENCE)
    page.click("button[type=submit]")
    page.wait_for_selector(".panel[data-run='0'][data-answers='4'][data-state=ready]")


def test_the_page_captions_an_uploaded_image_and_draws_each_words_attention_on_it(browser, runs, tmp_path):
    path, _, _ = scene_png(tmp_path / "scene.png")
    expected = answer(client(runs["captioner"]), image=base64.b64encode(path.read_bytes()).decode(), beam=4)
    with serving(runs["captioner"]) as url:
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        page.goto(url)
        page.wait_for_selector("#upload", state="visible")  # shown once /api/info has named an image run
        page.set_input_files("#upload", str(path))
        page.click("button[type=submit]")
        page.wait_for_selector(".panel[data-run='0'][data-state=ready]")
        assert page.locator(".nbest li .text").all_inner_texts() == [
            o["text"] or "(empty)" for o in expected["outputs"]
        ]
        # the first word's cross-attention on the image: the heads' mean, then each head (1 layer, 2 heads)
        assert page.locator("canvas.patches").count() == 3
        last = len(expected["steps"]) - 1
        page.click(f".tok[data-step='{last}']")
        assert f"“{expected['steps'][last]['token']}”" in page.inner_text(".step")
        cross = next(m for m in expected["attention"] if m["kind"] == "cross")
        weights = cross["probs"][1][last]  # head 1's weights for the last word over the 4x4 patches, row-major
        centre = """([patch]) => { const c = document.querySelector('canvas.patches[data-head="1"]'), s = c.width / 32;
            return Array.from(c.getContext('2d').getImageData(((patch % 4) * 8 + 4) * s,
                                                              (Math.floor(patch / 4) * 8 + 4) * s, 1, 1).data); }"""
        for patch in range(16):  # on the grey picture, red - blue = 0.75 (252 - 40) w / max w: the weight drawn
            red, _, blue, _ = page.evaluate(centre, [patch])
            assert abs((red - blue) - 0.75 * 212 * weights[patch] / max(weights)) <= 1.5


def test_the_page_answers_a_question_on_an_uploaded_image_and_draws_each_words_attention_on_it(browser, runs, tmp_path):
    path, _, _ = scene_png(tmp_path / "scene.png")
    expected = answer(client(runs["qa"]), image=base64.b64encode(path.read_bytes()).decode(), question=QUESTION)
    with serving(runs["qa"]) as url:
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        page.goto(url)
        page.wait_for_selector("#question", state="visible")  # shown once /api/info has named a question answerer
        page.set_input_files("#upload", str(path))
        page.fill("#question", QUESTION)
        page.click("button[type=submit]")
        page.wait_for_selector(".panel[data-run='0'][data-state=ready]")
        rows = page.locator(".classes tr").all_inner_texts()
        assert [row.split()[0] for row in rows] == [o["label"] for o in expected["outputs"]]
        assert [row.split()[-1] for row in rows] == [f"{o['probability']:.4f}" for o in expected["outputs"]]
        # the [CLS]'s attention over the patches, per layer: the heads' mean, then each head (2 layers, 2 heads)
        assert page.locator("canvas.patches").count() == 6
        assert page.locator(".tok").all_inner_texts() == expected["question_tokens"]
        word = 2
        page.click(f".tok[data-step='{word}']")
        assert f"“{expected['question_tokens'][word]}” over the patches" in page.inner_text(".panel")
        block = expected["text_to_image"][1]
        weights = block["probs"][1][word]  # layer 1, head 1: the word's weights over the 4x4 patches, row-major
        centre = """([module, patch]) => {
            const c = document.querySelector(`canvas.patches[data-module="${module}"][data-head="1"]`), s = c.width / 32;
            return Array.from(c.getContext('2d').getImageData(((patch % 4) * 8 + 4) * s,
                                                              (Math.floor(patch / 4) * 8 + 4) * s, 1, 1).data); }"""
        for patch in range(16):  # on the grey picture, red - blue = 0.75 (252 - 40) w / max w: the weight drawn
            red, _, blue, _ = page.evaluate(centre, [block["module"], patch])
            assert abs((red - blue) - 0.75 * 212 * weights[patch] / max(weights)) <= 1.5
        page.fill("#question", "   ")  # the server's refusal, on the page
        page.click("button[type=submit]")
        page.wait_for_selector(".panel[data-run='0'][data-state=error]")
        assert "the question is empty" in page.inner_text(".panel[data-run='0'] .error")
