"""The single-stream model (arch single_stream) and visual question answering (data.task visual_qa):
the config's early refusals; the joint sequence [words; patches] with its positions and modality
embeddings, by hand; the encoder's attention over it against torch.nn.MultiheadAttention with the
same weights, and the [CLS] head by hand; the text-only baseline's answers independent of the
pixels; the questions as data; a tiny run trained, evaluated, asked and inspected through the
command line, and the one-line refusals."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab import ConfigError, build_model, task_config
from attnlab.data.scenes import generate
from attnlab.data.tokenizers import BOS, EOS, PAD
from attnlab.nn.vision import patches
from attnlab.runs.checkpoint import load_run
from attnlab.tasks import Batching
from attnlab.tasks.visual_qa import VisualQA, kind_of

from helpers import run_cli, sized

ROOT = Path(__file__).resolve().parents[1]

MODEL = dict(
    arch="single_stream",
    vocab_size=12,
    n_classes=5,
    image_height=8,
    image_width=4,
    channels=3,
    patches=dict(size=4),
    stack=dict(d_model=8, n_heads=2, n_layers=2, d_ff=16, dropout=0.0),
    positions=dict(max_len=6),
)


def run_config(model: dict):
    from attnlab.runs.config import RunConfig

    return RunConfig.from_sections({"model": model, "data": {"task": "visual_qa"}, "train": {}})


def test_a_bad_config_fails_early_naming_the_field():
    with pytest.raises(ConfigError, match=r"held_out: 'purple triangle' is not a 'COLOUR SHAPE'"):
        task_config({"task": "visual_qa", "scenes": {"held_out": "purple triangle"}})
    with pytest.raises(ConfigError, match=r"held_out names no 'COLOUR SHAPE' combination"):
        task_config({"task": "visual_qa", "scenes": {"held_out": ""}})
    with pytest.raises(ConfigError, match=r"model.arch must be 'single_stream' for data.task 'visual_qa'; got 'vit'"):
        run_config({"arch": "vit"})
    with pytest.raises(
        ConfigError, match=r"^positions.scheme must be one of 'learned', 'sinusoidal', 'none' \(got 'rotary'\)"
    ):
        sized(**MODEL | {"positions": {"scheme": "rotary"}})
    with pytest.raises(ConfigError, match=r"image_tokens must be one of 'patches', 'none' \(got 'pixels'\)"):
        sized(**MODEL | {"image_tokens": "pixels"})
    with pytest.raises(ConfigError, match=r"image_width \(6\) must be divisible by patches.size \(4\)"):
        sized(**MODEL | {"image_width": 6})
    with pytest.raises(ConfigError, match=r"model.positions.max_len \(8\) must cover the longest sequence \(18\)"):
        run_config({"arch": "single_stream", "positions": {"max_len": 8}})


# -- the model ---------------------------------------------------------------------------------------


def test_the_joint_sequence_by_hand():
    """Two words and <bos>/<eos>, one padding, then a 2 x 1 grid of patches: each token's vector is
    its embedding, its position (1-D for words, row + column for patches) and its modality's row."""
    torch.manual_seed(0)
    model = build_model(*sized(**MODEL)).eval()
    images, ids = torch.randn(1, 3, 8, 4), torch.tensor([[BOS, 5, 7, EOS, PAD]])
    x, valid, modality = model.sequence(images, ids)
    text, image = model.text_embed, model.image_tokens
    m_text, m_image = model.modality.weight
    expected = [
        text.tokens.weight[int(w)] * math.sqrt(8) + text.positional.table.weight[t] + m_text
        for t, w in enumerate(ids[0])
    ]
    flat = images[0].reshape(3, 2, 4, 4).permute(1, 0, 2, 3).reshape(2, 48)  # patch k = rows 4k..4k+3, (c, row, col)
    torch.testing.assert_close(flat, patches(images, 4, 4)[0])
    for k, (row, column) in enumerate([(0, 0), (1, 0)]):
        expected.append(
            flat[k] @ image.patch_embed.projection.weight.T
            + image.patch_embed.projection.bias
            + image.positional.rows.weight[row]
            + image.positional.columns.weight[column]
            + m_image
        )
    torch.testing.assert_close(x[0], torch.stack(expected))
    assert modality.tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert valid.tolist() == [[True, True, True, True, False, True, True]]


def test_the_joint_attention_is_multihead_attention_with_the_same_weights_and_the_head_reads_cls():
    torch.manual_seed(0)
    model = build_model(*sized(**MODEL)).eval()
    images, ids = torch.randn(2, 3, 8, 4), torch.tensor([[BOS, 5, 7, EOS, PAD], [BOS, 9, EOS, PAD, PAD]])
    attention = model.encoder.layers[1].self_attn
    seen = {}
    attention.register_forward_hook(lambda m, args, kwargs, out: seen.update(x=args[0], out=out), with_kwargs=True)
    states, valid = model.encode(images, ids)
    reference = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(attention.qkv_proj.weight)
        reference.in_proj_bias.copy_(attention.qkv_proj.bias)
        reference.out_proj.weight.copy_(attention.out_proj.weight)
        reference.out_proj.bias.copy_(attention.out_proj.bias)
        expected, weights = reference(seen["x"], seen["x"], seen["x"], key_padding_mask=~valid)
    torch.testing.assert_close(seen["out"], expected, atol=1e-5, rtol=0)
    assert seen["x"].shape == (2, 7, 8) and weights[1, :, 3:5].abs().max() == 0  # no word nor patch reads padding
    assert weights[:, :5, 5:].sum() > 0 and weights[:, 5:, :5].sum() > 0  # words read patches and patches words
    head = model.classifier  # pooled: W_c tanh(W_p z_[CLS] + b_p) + b_c
    by_hand = torch.tanh(states[:, 0] @ head.pool.weight.T + head.pool.bias) @ head.out.weight.T + head.out.bias
    torch.testing.assert_close(model.classify(images, ids), by_hand)


def test_the_text_only_baseline_never_reads_the_pixels():
    torch.manual_seed(0)
    baseline = build_model(*sized(**MODEL | {"image_tokens": "none"})).eval()
    with_image = build_model(*sized(**MODEL)).eval()
    ids = torch.tensor([[BOS, 5, 7, EOS], [BOS, 9, 4, EOS]])
    a, b = torch.randn(2, 3, 8, 4), torch.randn(2, 3, 8, 4) * 10
    torch.testing.assert_close(baseline.classify(a, ids), baseline.classify(b, ids), rtol=0, atol=0)
    assert (with_image.classify(a, ids) - with_image.classify(b, ids)).abs().max() > 1e-3  # the check can fail
    a.requires_grad_(True)
    assert torch.autograd.grad(baseline.classify(a, ids).sum(), a, allow_unused=True) == (None,)
    assert baseline.sequence(a, ids)[0].shape == (2, 4, 8)  # the words alone
    assert not any(name.startswith("image_tokens.") for name in baseline.state_dict())


# -- the data ----------------------------------------------------------------------------------------


def test_each_question_is_asked_of_its_own_scene():
    cfg = task_config({"task": "visual_qa", "splits": {"n_train": 300, "n_valid": 5, "n_test": 5}})
    data = cfg.task.prepare(Batching(4096, 8, 0))
    drawn = generate("compositional", 5, seed=0)
    pairs = [(i, q, a) for i, scene in enumerate(drawn) for q, a in scene.questions]
    part = data.splits["compositional"]
    assert part.questions == [q for _, q, _ in pairs] and part.scene.tolist() == [i for i, _, _ in pairs]
    assert [data.labels[i] for i in part.labels.tolist()] == [a for _, _, a in pairs]
    batch = data.eval_batches("compositional")[0]
    image = torch.tensor(drawn[pairs[3][0]].pixels).permute(2, 0, 1).float()
    torch.testing.assert_close(batch.images[3], data.standardise(image[None])[0])
    # word_nopunct: the question's words, without its '?'
    assert data.tokenizers["src"].decode(batch.ids[3][1:].tolist()) == pairs[3][1].rstrip("?")
    assert batch.ids[3][0] == BOS and EOS in batch.ids[3].tolist()
    assert set(data.labels) == {"0", "1", "2", "3", "red", "green", "blue", "yellow", "circle", "square", "triangle"}
    assert [
        kind_of(q) for q in ("how many circles?", "what colour is the square?", "what shape is the red object?")
    ] == ["count", "colour", "shape"]


# -- a tiny run through the command line -------------------------------------------------------------

RECIPE = """\
model: {arch: single_stream, patches: {size: 4}, stack: {d_model: 32, n_heads: 2, n_layers: 2, d_ff: 64, dropout: 0.0}}
data: {task: visual_qa, scenes: {max_objects: 1}, splits: {n_train: 400, n_valid: 40, n_test: 40}}
train: {max_steps: 300, batch_size: 32, optimizer: adamw, lr_schedule: constant, lr: 3.0e-3, warmup_steps: 1,
        eval_every: 300, early_stop_metric: accuracy, label_smoothing: 0.0, progress: false}
"""


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("visual_qa")
    (root / "visual_qa.yaml").write_text(RECIPE)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        done = run_cli("train", str(root / "visual_qa.yaml"), "--out", str(root / "run"))
    finally:
        torch.set_num_threads(threads)
    assert done.returncode == 0, done.stderr
    return root, done


def write_png(path: Path, pixels: np.ndarray) -> str:
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return str(path)


def best_without_the_image(split: str, n_train: int, n: int) -> float:
    """The accuracy on ``split`` (one-object scenes) of the best answerer that reads the question alone:
    each question's most frequent training answer (ties: the first seen)."""
    answers: dict[str, Counter] = {}
    for scene in generate("train", n_train, seed=0, max_objects=1):
        for q, a in scene.questions:
            answers.setdefault(q, Counter())[a] += 1
    pairs = [pair for scene in generate(split, n, seed=0, max_objects=1) for pair in scene.questions]
    return sum(q in answers and answers[q].most_common(1)[0][0] == a for q, a in pairs) / len(pairs)


def test_a_tiny_single_stream_model_learns_to_answer(qa_run):
    root, done = qa_run
    assert "questions on images 32x32x3: train 2,000 (400 scenes)" in done.stdout
    valid = [
        json.loads(line)
        for line in (root / "run" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["split"] == "valid"
    ]
    assert best_without_the_image("valid", 400, 40) == pytest.approx(0.535)
    assert valid[-1]["accuracy"] >= 0.535 + 0.15
    result = run_cli("evaluate", str(root / "run"), "--split", "test", "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["accuracy"] >= best_without_the_image("test", 400, 40) + 0.15 and record["examples"] == 200
    assert set(record["by_kind"]) == {"count", "colour", "shape"}
    assert sum(k["questions"] for k in record["by_kind"].values()) == 200
    text = run_cli("evaluate", str(root / "run"), "--split", "compositional")
    assert text.returncode == 0 and "accuracy by kind of question: count" in text.stdout


def test_ask_answers_as_the_model_does(qa_run, tmp_path):
    root, _ = qa_run
    drawn = generate("test", 2, seed=0, max_objects=1)
    paths = [write_png(tmp_path / f"{i}.png", s.pixels) for i, s in enumerate(drawn)]
    model, tokenizers, _ = load_run(root / "run")
    state = json.loads((root / "run" / "task_state.json").read_text())
    x = torch.stack([torch.tensor(s.pixels).permute(2, 0, 1).float() for s in drawn])
    x = (x - torch.tensor(state["mean"])[:, None, None]) / torch.tensor(state["std"])[:, None, None]
    question = "how many circles?"
    ids = torch.tensor([[BOS, *tokenizers["src"].encode(question), EOS]] * 2)
    p = model.eval().classify(x, ids).softmax(-1).detach()
    done = run_cli("ask", str(root / "run"), *paths, "--question", question)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{path}\t{state['labels'][int(row.argmax())]}\t{float(row.max()):.4f}" for path, row in zip(paths, p)
    ]
    as_json = json.loads(run_cli("ask", str(root / "run"), paths[0], "--question", question, "--json").stdout)
    assert as_json["question"] == question and as_json["probabilities"] == pytest.approx(
        dict(zip(state["labels"], p[0].tolist())), abs=1e-6
    )
    unmarked = run_cli("ask", str(root / "run"), *paths, "--question", "how many circles")  # issue 64: the same words
    assert unmarked.returncode == 0 and unmarked.stdout == done.stdout


def test_evaluate_reads_a_questions_file_as_the_split_it_holds(qa_run, tmp_path):
    root, _ = qa_run
    drawn = generate("test", 40, seed=0, max_objects=1)
    lines = [f"img/{i}.png\t{q}\t{a}\n" for i, scene in enumerate(drawn) for q, a in scene.questions]
    (tmp_path / "img").mkdir()
    for i, scene in enumerate(drawn):
        write_png(tmp_path / "img" / f"{i}.png", scene.pixels)
    (tmp_path / "questions.tsv").write_text("".join(lines))
    from_file = run_cli("evaluate", str(root / "run"), "--data", str(tmp_path / "questions.tsv"), "--json")
    from_split = run_cli("evaluate", str(root / "run"), "--split", "test", "--json")
    assert from_file.returncode == 0, from_file.stderr
    file_record, split_record = json.loads(from_file.stdout), json.loads(from_split.stdout)
    assert file_record["confusion"] == split_record["confusion"] and file_record["by_kind"] == split_record["by_kind"]
    (tmp_path / "questions.tsv").write_text(lines[0] + "img/0.png\thow many circles?\n")
    short = run_cli("evaluate", str(root / "run"), "--data", str(tmp_path / "questions.tsv"))
    assert short.returncode == 4 and short.stderr == (
        f"error: {tmp_path / 'questions.tsv'}:2: expected 'image TAB question TAB answer', found 2 field(s)\n"
    )
    (tmp_path / "questions.tsv").write_text("img/0.png\thow many circles?\tmany\n")
    unknown = run_cli("evaluate", str(root / "run"), "--data", str(tmp_path / "questions.tsv"))
    assert unknown.returncode == 4 and unknown.stderr.startswith(
        f"error: {tmp_path / 'questions.tsv'}:1: answer 'many' is not one the model was trained on (0, 1, "
    )


def test_refusals_in_one_line(qa_run, tmp_path):
    root, _ = qa_run
    image = write_png(tmp_path / "scene.png", generate("test", 1, seed=0)[0].pixels)
    (tmp_path / "broken.png").write_bytes(b"not a png")
    broken = run_cli("ask", str(root / "run"), str(tmp_path / "broken.png"), "--question", "how many circles?")
    assert (broken.returncode, broken.stderr) == (
        4,
        f"error: {tmp_path / 'broken.png'}: not an image that Pillow can decode\n",
    )
    empty = run_cli("ask", str(root / "run"), image, "--question", " ")
    assert (
        empty.returncode == 2
        and empty.stderr.startswith("error: --question is empty")
        and empty.stderr.count("\n") == 1
    )
    caption = run_cli("caption", str(root / "run"), image)
    assert caption.returncode == 2 and caption.stderr == (
        f"error: {root / 'run'} is a run of data.task 'visual_qa'; `attnlab caption` needs data.task 'captioning' "
        f"(this run's commands: ask, evaluate, inspect)\n"
    )
    captioner = tmp_path / "captioner"
    captioner.mkdir()
    (captioner / "config.yaml").write_text(
        "model: {arch: captioner, vocab_size: 10}\ndata: {task: captioning, images: {dataset: scenes}}\ntrain: {}\n"
    )
    question = run_cli("ask", str(captioner), image, "--question", "how many circles?")
    assert question.returncode == 2 and question.stderr.startswith(
        f"error: {captioner} is a run of data.task 'captioning'; `attnlab ask` needs data.task 'visual_qa'"
    )
    assert question.stderr.count("\n") == 1
    without = run_cli("inspect", str(root / "run"), "--src", image, "--out", str(tmp_path / "fig"))
    assert without.returncode == 2 and without.stderr.startswith("error: a single-stream run answers a question")
    assert not (tmp_path / "fig").exists()


def test_inspect_draws_the_cross_modal_blocks(qa_run, tmp_path):
    root, _ = qa_run
    image = write_png(tmp_path / "scene.png", generate("test", 1, seed=0, max_objects=1)[0].pixels)
    done = run_cli(
        "inspect",
        str(root / "run"),
        "--src",
        image,
        "--question",
        "what colour is the circle?",
        "--out",
        str(tmp_path / "fig"),
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "fig" / "summary.json").read_text())
    assert summary["question_tokens"] == ["<bos>", "what", "colour", "is", "the", "circle", "<eos>"]
    assert summary["image_tokens"] == 64 and summary["grid"] == [8, 8]
    for entry in summary["modules"].values():
        to_text, to_image = torch.tensor(entry["text_to_text"]), torch.tensor(entry["text_to_image"])
        assert to_image.shape == (2, 7, 64) and torch.tensor(entry["image_to_text"]).shape == (2, 64, 7)
        torch.testing.assert_close(to_text.sum(-1) + to_image.sum(-1), torch.ones(2, 7))  # the rows of the map
        assert entry["text_to_image_share"] == pytest.approx(to_image.sum(-1).mean(-1).tolist(), abs=1e-4)
    names = {Path(f).name for f in summary["files"]}
    assert {
        "encoder-0-text.png",
        "encoder-1-text-to-image.png",
        "encoder-1-text-to-image-heads.png",
        "encoder-1-image-to-text.png",
        "averaged-text-to-image.png",
        "averaged-image-to-text.png",
        "entropy.png",
    } <= names
    assert all(Path(f).is_file() for f in summary["files"])
    assert f"prediction: {summary['prediction']['label']}" in done.stdout


@pytest.mark.parametrize("recipe, image_tokens", [("visual_qa.yaml", "patches"), ("visual_qa_text_only.yaml", "none")])
def test_the_visual_qa_recipes_are_valid_configs(recipe, image_tokens):
    from attnlab.runs.config import RunConfig

    cfg = RunConfig.from_file(ROOT / "recipes" / "multimodal" / recipe)
    assert type(cfg.data.task) is VisualQA and cfg.data.scenes.held_combinations == ("red triangle",)
    shape = cfg.planned_shape(vocab_size=22)
    assert (cfg.model.arch, cfg.model.image_tokens, cfg.model.patches.grid(shape)) == (
        "single_stream",
        image_tokens,
        (8, 8),
    )
    assert shape.vocab_size == 22
    if image_tokens == "patches":  # `info` reads the data, so it counts the 11 answers' head
        described = run_cli("info", str(ROOT / "recipes" / "multimodal" / recipe))
        assert described.returncode == 0, described.stderr
        assert described.stdout.startswith(
            f"{ROOT / 'recipes' / 'multimodal' / recipe}: single_stream, d_model 64, "
            f"4 heads, 3 layers, d_ff 128, vocab 22\nparameters{' ' * 25}113,163\n"
        )
