"""The CLIP-style dual encoder (arch dual_encoder, data.task contrastive): the symmetric InfoNCE and
its temperature's gradient against a hand computation on a 3x3 batch (with and without a repeated
caption), the towers against the ViT's and the text encoder's with the same weights, zero-shot
classification against the argmax of prompt similarities computed one text at a time, recall@k
on a hand-made similarity matrix, the config's one-line refusals, and a tiny run trained,
evaluated and predicting through the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab import ConfigError, build_model, task_config
from attnlab.data.scenes import generate
from attnlab.data.tokenizers import Tokenizer
from attnlab.nn.dual_encoder import symmetric_info_nce
from attnlab.runs.checkpoint import load_run
from attnlab.tasks import Batching
from attnlab.tasks.contrastive import Contrastive, PairBatch
from attnlab.tasks.retrieval import (
    class_embeddings,
    labelled_by_prompt,
    recall_at_k,
    retrieval_scores,
    text_ids,
    zero_shot_probabilities,
)

from helpers import run_cli, sized

ROOT = Path(__file__).resolve().parents[1]

DUAL = dict(
    arch="dual_encoder",
    vocab_size=20,
    image_height=16,
    image_width=12,
    channels=3,
    patches=dict(size=4),
    stack=dict(d_model=16, n_heads=2, d_ff=32, dropout=0.0),
    n_image_layers=2,
    n_text_layers=1,
    d_embed=8,
)

# three images and three texts, unit vectors of a 3-wide joint space
IMAGES = [[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.0, 0.6, 0.8]]
TEXTS = [[0.8, 0.6, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]


def cosines() -> list[list[float]]:
    return [[sum(a * b for a, b in zip(image, text)) for text in TEXTS] for image in IMAGES]


def soft_cross_entropy(row: list[float], targets: list[float]) -> float:
    lse = math.log(sum(math.exp(x) for x in row))
    return sum(q * (lse - x) for q, x in zip(targets, row))


def hand_loss_and_gradient(scale: float, positives: list[list[int]], smoothing: float = 0.0) -> tuple[float, float]:
    """The mean over pairs of (CE image -> text + CE text -> image) / 2, targets spread evenly over
    the positives, and its derivative by t, where scale = exp(t): d CE / d t = scale * sum_j (p_j -
    q_j) S_j for a row of cosines S, probabilities p and targets q."""
    S = cosines()
    columns = [[S[i][j] for i in range(3)] for j in range(3)]
    pos_columns = [[positives[i][j] for i in range(3)] for j in range(3)]
    loss = grad = 0.0
    for rows, pos in ((S, positives), (columns, pos_columns)):
        for row, p in zip(rows, pos):
            q = [(1 - smoothing) * v / sum(p) + smoothing / 3 for v in p]
            logits = [scale * s for s in row]
            loss += soft_cross_entropy(logits, q) / 2 / 3
            z = sum(math.exp(x) for x in logits)
            grad += scale * sum((math.exp(x) / z - qj) * s for x, qj, s in zip(logits, q, row)) / 2 / 3
    return loss, grad


def loss_and_gradient(model, positives: list[list[int]], smoothing: float = 0.0) -> tuple[float, float]:
    logits = model.similarity(torch.tensor(IMAGES), torch.tensor(TEXTS))
    loss = symmetric_info_nce(logits, torch.tensor(positives, dtype=torch.bool), smoothing).mean()
    model.zero_grad()
    loss.backward()
    return loss.item(), model.log_logit_scale.grad.item()


@pytest.mark.parametrize(
    "positives",
    [
        [[1, 0, 0], [0, 1, 0], [0, 0, 1]],  # three distinct captions
        [[1, 1, 0], [1, 1, 0], [0, 0, 1]],
    ],  # texts 0 and 1 the same caption
    ids=["distinct", "repeated"],
)
def test_info_nce_on_a_3x3_batch_equals_a_hand_computation(positives):
    model = build_model(*sized(**DUAL))
    assert model.logit_scale.item() == pytest.approx(1 / 0.07, rel=1e-7)  # CLIP's initial temperature
    loss, grad = loss_and_gradient(model, positives)
    expected_loss, expected_grad = hand_loss_and_gradient(1 / 0.07, positives)
    assert loss == pytest.approx(expected_loss, rel=1e-5) and grad == pytest.approx(expected_grad, rel=1e-4)
    with torch.no_grad():
        model.log_logit_scale.fill_(math.log(2.0))
    loss, grad = loss_and_gradient(model, positives)
    expected_loss, expected_grad = hand_loss_and_gradient(2.0, positives)
    assert loss == pytest.approx(expected_loss, rel=1e-5) and grad == pytest.approx(expected_grad, rel=1e-4)
    loss, grad = loss_and_gradient(model, positives, smoothing=0.1)  # targets (1 - eps) q + eps / B
    expected_loss, expected_grad = hand_loss_and_gradient(2.0, positives, smoothing=0.1)
    assert loss == pytest.approx(expected_loss, rel=1e-5) and grad == pytest.approx(expected_grad, rel=1e-4)


def test_the_temperature_is_clamped_at_100_and_gets_no_gradient_there():
    model = build_model(*sized(**DUAL))
    with torch.no_grad():
        model.log_logit_scale.fill_(math.log(200.0))
    assert model.logit_scale.item() == 100.0
    loss, grad = loss_and_gradient(model, [[1, 0, 0], [0, 1, 0], [0, 0, 1]])
    assert loss == pytest.approx(hand_loss_and_gradient(100.0, [[1, 0, 0], [0, 1, 0], [0, 0, 1]])[0], rel=1e-5)
    assert grad == 0.0


def test_a_batchs_positives_are_the_texts_with_the_same_tokens():
    text = text_ids([[7, 8], [7, 8, 9], [7, 8], [9]])  # BOS ... EOS, PAD-padded
    batch = PairBatch(torch.zeros(4, 3, 4, 4), text)
    assert batch.positives().int().tolist() == [[1, 0, 1, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]]
    assert batch.n_targets == 4


def test_the_towers_are_the_vit_and_the_text_encoder_with_the_same_weights():
    torch.manual_seed(0)
    model = build_model(*sized(**{**DUAL, "n_image_layers": 1})).eval()
    vit = build_model(
        *sized(
            arch="vit",
            image_height=16,
            image_width=12,
            channels=3,
            n_classes=2,
            patches=dict(size=4, positional="learned_2d"),
            stack=dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0, layer_norm_eps=1e-5),
            classifier=dict(pooling="cls"),
        )
    ).eval()
    text = build_model(
        *sized(
            arch="encoder_only",
            vocab_size=20,
            stack=dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0, activation="gelu", norm="pre"),
        )
    ).eval()
    missing = model.image.load_state_dict(vit.state_dict(), strict=False).missing_keys
    assert missing == [] and model.text.load_state_dict(text.state_dict(), strict=False).missing_keys == []
    images, ids = torch.randn(2, 3, 16, 12), torch.tensor([[1, 5, 6, 2], [1, 7, 2, 0]])
    torch.testing.assert_close(model.image(images), vit.encode(images)[:, 0])  # the class token's final state
    torch.testing.assert_close(model.text(ids), text.encode(ids)[:, 0])  # the BOS's
    expected = torch.nn.functional.normalize(vit.encode(images)[:, 0] @ model.image_projection.weight.T, dim=-1)
    torch.testing.assert_close(model.encode_image(images), expected)
    assert model.image_projection.bias is None and model.text_projection.bias is None


def test_zero_shot_classification_is_the_argmax_of_the_prompt_similarities():
    torch.manual_seed(0)
    labels, templates = ["red circle", "blue square", "green triangle"], ["a small {label}", "a large {label}"]
    tokenizer = Tokenizer.train("word", [t.format(label=label) for label in labels for t in templates], 100)
    model = build_model(*sized(**{**DUAL, "vocab_size": tokenizer.vocab_size})).eval()
    images = torch.randn(5, 3, 16, 12)
    with torch.no_grad():
        image_vectors = [model.encode_image(image[None])[0] for image in images]  # one at a time
        classes = []
        for label in labels:
            prompts = [model.encode_text(text_ids([tokenizer.encode(t.format(label=label))]))[0] for t in templates]
            mean = sum(prompts) / len(prompts)
            classes.append(mean / mean.norm())
        similarity = torch.tensor([[float(v @ c) for c in classes] for v in image_vectors])
        embedded = torch.stack(image_vectors)
    probabilities = zero_shot_probabilities(model, embedded, class_embeddings(model, tokenizer, labels, templates))
    assert probabilities.argmax(-1).tolist() == similarity.argmax(-1).tolist()
    torch.testing.assert_close(probabilities, (similarity / 0.07).softmax(-1), atol=1e-5, rtol=0)
    captions = ["a small blue square", "a red circle", "a large green triangle left of a small red circle"]
    assert labelled_by_prompt(captions, labels, templates) == {0: 1}  # only the first is a prompt


def test_recall_at_k_on_a_hand_made_similarity_matrix():
    similarity = torch.tensor([[0.9, 0.1, 0.5, 0.3], [0.2, 0.8, 0.7, 0.1], [0.4, 0.3, 0.2, 0.6]])
    relevant = torch.tensor(
        [
            [1, 0, 0, 0],  # found first
            [0, 0, 1, 0],  # second
            [0, 1, 0, 0],
        ]
    ).bool()  # third
    assert recall_at_k(similarity, relevant, 1) == pytest.approx(1 / 3)
    assert recall_at_k(similarity, relevant, 2) == pytest.approx(2 / 3)
    assert recall_at_k(similarity, relevant, 3) == 1.0 and recall_at_k(similarity, relevant, 5) == 1.0
    # images 0 and 2 share caption 0; texts are the distinct captions
    images = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    texts = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    scores = retrieval_scores(images, texts, torch.tensor([0, 1, 0]))
    assert scores["image_to_text_r1"] == pytest.approx(2 / 3)  # image 2 is nearer caption 1
    assert scores["text_to_image_r1"] == 1.0 and scores["image_to_text_r5"] == 1.0


def test_a_bad_config_fails_early_naming_the_field():
    from attnlab.runs.config import RunConfig

    def run_config(model: dict, data: dict | None = None):
        data = {"task": "contrastive", "images": {"dataset": "scenes"}, **(data or {})}
        return RunConfig.from_sections({"model": model, "data": data, "train": {}})

    refusals = [
        (
            lambda: run_config({"arch": "captioner"}),
            "model.arch must be 'dual_encoder' for data.task 'contrastive'; got 'captioner'",
        ),
        (lambda: sized(**DUAL, init_temperature=0.0), "init_temperature must be > 0 (got 0.0)"),
        (
            lambda: sized(**DUAL, max_logit_scale=10.0),
            "max_logit_scale (10.0) must be at least 1 / init_temperature (14.29)",
        ),
        (lambda: sized(**{**DUAL, "d_embed": 0}), "d_embed must be >= 1 (got 0)"),
        (
            lambda: sized(**DUAL, text_pooling="eos"),
            "text_pooling must be one of 'cls', 'distilled', 'mean' (got 'eos')",
        ),
        (lambda: sized(**DUAL, embeddings={"tie": "output"}), "embeddings.tie must be one of 'none' (got 'output')"),
        (
            lambda: task_config(
                {"task": "contrastive", "images": {"dataset": "scenes"}, "prompts": "a {colour} thing"}
            ),
            "prompts: 'a {colour} thing' must name the class as {label} and hold no other braces (e.g. 'a picture of a "
            "{label}')",
        ),
        (
            lambda: task_config({"task": "contrastive", "images": {"dataset": "scenes"}, "labels": "red circle"}),
            "labels names 1 class; zero-shot classification needs at least two (comma-separated)",
        ),
        (
            lambda: task_config({"task": "contrastive", "images": {"dataset": "scenes"}, "labels": " , "}),
            "labels names 0 classes; zero-shot classification needs at least two (comma-separated)",
        ),
        (
            lambda: task_config(
                {"task": "contrastive", "images": {"dataset": "scenes"}, "labels": "red circle, red circle"}
            ),
            "labels names 'red circle' twice",
        ),
        (
            lambda: task_config(
                {"task": "contrastive", "images": {"dataset": "scenes"}, "splits": {"n_train": 10}}
            ).task.prepare(Batching(4096, 1, 0)),
            "train.batch_size (1) must be at least 2 for data.task 'contrastive': an image's negatives are the batch's "
            "other captions",
        ),
    ]
    for make, message in refusals:
        with pytest.raises(ConfigError) as refused:
            make()
        assert str(refused.value).endswith(message) and "\n" not in str(refused.value)


# -- a tiny run through the command line -------------------------------------------------------------

RECIPE = """\
model: {arch: dual_encoder, patches: {size: 8}, stack: {d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64, dropout: 0.0}, d_embed: 32, image_pooling: mean, text_pooling: mean}
data: {task: contrastive, images: {dataset: scenes}, scenes: {max_objects: 1}, splits: {n_train: 600, n_valid: 100, n_test: 100}}
train: {max_steps: 150, batch_size: 32, optimizer: adamw, lr_schedule: constant, lr: 3.0e-3, warmup_steps: 1,
        eval_every: 75, early_stop_metric: recall_at_1, label_smoothing: 0.0, progress: false}
"""


def train_tiny(root: Path, out: str):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same sums in the same order, run after run
    try:
        done = run_cli("train", str(root / "dual.yaml"), "--out", str(root / out))
    finally:
        torch.set_num_threads(threads)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def contrastive_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("contrastive")
    (root / "dual.yaml").write_text(RECIPE)
    return root, train_tiny(root, "run")


def test_a_tiny_dual_encoder_learns_to_match_one_object_scenes(contrastive_run):
    root, done = contrastive_run
    assert "image-caption pairs 32x32x3: train 600, valid 100, test 100, compositional 100; vocabulary" in done.stdout
    valid = [
        json.loads(line)
        for line in (root / "run" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["split"] == "valid"
    ]
    # chance: recall@1 about 1 in 22 (the distinct captions of one object, 2 sizes x 11 seen colour-shape pairs),
    # zero-shot 1 in 12
    assert valid[-1]["recall_at_1"] > 0.4 and valid[-1]["zero_shot_accuracy"] > 0.3
    assert valid[-1]["valid_loss"] < valid[0]["valid_loss"] or valid[-1]["recall_at_1"] > valid[0]["recall_at_1"]
    result = run_cli("evaluate", str(root / "run"), "--split", "valid", "--json", "--checkpoint", "last")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)  # the validation's own figures, computed again from the saved weights
    assert (record["image_to_text_r1"] + record["text_to_image_r1"]) / 2 == pytest.approx(valid[-1]["recall_at_1"])
    assert record["zero_shot_accuracy"] == pytest.approx(valid[-1]["zero_shot_accuracy"])
    assert record["images"] == 100 and record["zero_shot_images"] == 100 and record["zero_shot_classes"] == 12
    train_tiny(root, "again")  # the same seed, the same numbers
    assert [
        json.loads(line)
        for line in (root / "again" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["split"] == "valid"
    ] == valid
    text = run_cli("evaluate", str(root / "run"), "--split", "compositional")
    assert text.returncode == 0 and "(100 images, 2 distinct captions, split compositional)" in text.stdout
    assert "zero-shot accuracy" in text.stdout


def write_png(path: Path, pixels: np.ndarray) -> Path:
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return path


def test_predict_classifies_image_files_zero_shot(contrastive_run, tmp_path):
    root, _ = contrastive_run
    drawn = generate("test", 4, seed=0, max_objects=1)
    paths = [str(write_png(tmp_path / f"{i}.png", s.pixels)) for i, s in enumerate(drawn)]
    model, tokenizers, _ = load_run(root / "run")
    state = json.loads((root / "run" / "task_state.json").read_text())
    x = torch.stack([torch.tensor(s.pixels).permute(2, 0, 1).float() for s in drawn])
    x = (x - torch.tensor(state["mean"])[:, None, None]) / torch.tensor(state["std"])[:, None, None]
    with torch.no_grad():
        similarity = (
            model.eval().encode_image(x)
            @ class_embeddings(model, tokenizers["tgt"], state["labels"], state["prompts"]).T
        )
    expected = [state["labels"][c] for c in similarity.argmax(-1).tolist()]
    done = run_cli("predict", str(root / "run"), *paths)
    assert done.returncode == 0, done.stderr
    assert [line.split("\t")[:2] for line in done.stdout.splitlines()] == [[p, e] for p, e in zip(paths, expected)]
    chosen = run_cli(
        "predict",
        str(root / "run"),
        *paths,
        "--labels",
        "blue triangle, yellow square",
        "--prompts",
        "a large {label}",
        "--json",
    )
    assert chosen.returncode == 0, chosen.stderr
    records = [json.loads(line) for line in chosen.stdout.splitlines()]
    assert [sorted(r["probabilities"]) for r in records] == [["blue triangle", "yellow square"]] * 4
    with torch.no_grad():
        two = (
            model.encode_image(x)
            @ class_embeddings(model, tokenizers["tgt"], ["blue triangle", "yellow square"], ["a large {label}"]).T
        )
    assert [r["label"] for r in records] == [["blue triangle", "yellow square"][c] for c in two.argmax(-1).tolist()]
    unseen = run_cli("predict", str(root / "run"), paths[0], "--labels", "red dog,blue cat")
    assert unseen.returncode == 0
    assert unseen.stderr.startswith("note: 4 prompts hold words the run's captions never had")
    one = run_cli("predict", str(root / "run"), paths[0], "--labels", "red circle")
    assert one.returncode == 2 and one.stderr.strip() == (
        "error: --labels: labels names 1 class; zero-shot classification needs at least two (comma-separated)"
    )
    none = run_cli("predict", str(root / "run"))
    assert none.returncode == 2 and none.stderr.strip() == (
        "error: give the images to classify as arguments: attnlab predict RUN image.png [more.png ...]"
    )
    (tmp_path / "captions.tsv").write_text("".join(f"{i}.png\t{s.caption}\n" for i, s in enumerate(drawn)))
    on_file = run_cli("evaluate", str(root / "run"), "--data", str(tmp_path / "captions.tsv"), "--json")
    assert on_file.returncode == 0, on_file.stderr
    record = json.loads(on_file.stdout)
    assert (record["images"], record["zero_shot_images"], record["captions"]) == (4, 4, len({s.caption for s in drawn}))
    assert (
        record["zero_shot_accuracy"]
        == sum(e == f"{o.colour} {o.shape}" for e, o in zip(expected, (s.objects[0] for s in drawn))) / 4
    )
    (tmp_path / "scene.tsv").write_text("0.png\ta small red circle left of a large blue square\n")
    unlabelled = run_cli("evaluate", str(root / "run"), "--data", str(tmp_path / "scene.tsv"))
    assert unlabelled.returncode == 0 and unlabelled.stdout.splitlines()[2] == (
        "zero-shot: no image is captioned by a prompt of the 12 classes"
    )
    caption = run_cli("caption", str(root / "run"), paths[0])
    assert caption.returncode == 2 and "`attnlab caption` needs data.task" in caption.stderr
    assert caption.stderr.count("\n") == 1


def test_the_dual_encoder_recipe_is_a_valid_config():
    from attnlab.runs.config import RunConfig

    cfg = RunConfig.from_file(ROOT / "recipes" / "multimodal" / "dual_encoder.yaml")
    assert type(cfg.data.task) is Contrastive and cfg.data.scenes.held_combinations == ("red triangle",)
    assert len(cfg.data.class_names) == 12 and cfg.data.templates == ["a small {label}", "a large {label}"]
    shape = cfg.planned_shape(vocab_size=17)
    assert (cfg.model.arch, shape.image_height, shape.channels, cfg.model.patches.grid(shape)) == (
        "dual_encoder",
        32,
        3,
        (8, 8),
    )
    assert shape.vocab_size == 17


def test_a_run_on_captions_files_has_no_classes_of_its_own(tmp_path):
    lines = []
    for i, scene in enumerate(generate("train", 12, seed=0, max_objects=1)):
        write_png(tmp_path / f"{i}.png", scene.pixels)
        lines.append(f"{i}.png\t{scene.caption}\n")
    (tmp_path / "captions.tsv").write_text("".join(lines))
    (tmp_path / "dual.yaml").write_text(
        "model: {arch: dual_encoder, patches: {size: 8}, stack: {d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32}, d_embed: 8}\n"
        f"data: {{task: contrastive, train: {tmp_path / 'captions.tsv'}, valid: {tmp_path / 'captions.tsv'}}}\n"
        "train: {max_steps: 2, batch_size: 4, eval_every: 2, label_smoothing: 0.0, progress: false}\n"
    )
    assert train_tiny(tmp_path, "run").returncode == 0
    run = str(tmp_path / "run")
    on_file = run_cli("evaluate", run, "--data", str(tmp_path / "captions.tsv"))
    assert on_file.returncode == 0
    assert on_file.stdout.splitlines()[2] == "zero-shot: the run has no classes (data.labels)"
    refused = run_cli("predict", run, str(tmp_path / "0.png"))
    assert refused.returncode == 2
    assert refused.stderr == f"error: {run} has no zero-shot classes of its own (data.labels): give --labels\n"
    chosen = run_cli("predict", run, str(tmp_path / "0.png"), "--labels", "red circle,blue square", "--json")
    assert chosen.returncode == 0
    assert sorted(json.loads(chosen.stdout)["probabilities"]) == ["blue square", "red circle"]
