"""The classification task: reading labelled TSV, BERT's inputs (segments, truncation), pooling,
the metrics, and an encoder trained, saved and used through the command line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from attnlab import DataError, build_model
from attnlab.data.corpora import Labelled, read_labelled
from attnlab.data.tokenizers import BOS, EOS, PAD, Tokenizer
from attnlab.eval.metrics import classification_scores, confusion_matrix, confusion_table
from attnlab.nn.pooling import FirstTokenPooling, MeanPooling
from attnlab.runs.checkpoint import load_run
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.classification import encode_inputs

from helpers import run_cli, sized


def write(path, text: str):
    path.write_text(text)
    return path


def test_labelled_files_of_single_texts_and_of_pairs_with_an_optional_header(tmp_path):
    single = read_labelled(write(tmp_path / "a.tsv", "a fine film\tpos\nno\tneg \n"))
    assert single == [Labelled("a fine film", None, "pos", 1), Labelled("no", None, "neg", 2)]
    pairs = read_labelled(
        write(tmp_path / "b.tsv", "premise\thypothesis\tlabel\nA man\tA person\tentail\n"), header=True
    )
    assert pairs == [Labelled("A man", "A person", "entail", 2)]


@pytest.mark.parametrize(
    "text,header,message",
    [
        ("a\tpos\nb\n", False, "b.tsv:2: found 1 tab-separated fields; expected 2 (text, label), as on line 1"),
        (
            "x\ty\tz\nb\tpos\n",
            False,
            "b.tsv:2: found 2 tab-separated fields; expected 3 (text_a, text_b, label), as on line 1",
        ),
        (
            "h\tl\na\tb\tc\td\n",
            True,
            "b.tsv:2: found 4 tab-separated fields; expected 2 (text, label) or 3 (text_a, text_b, label)",
        ),
        ("a\tpos\nb\t \n", False, "b.tsv:2: empty label"),
        ("a\tpos\n \tneg\n", False, "b.tsv:2: empty text"),
        ("text\tlabel\n", True, "b.tsv: no examples after the header line"),
    ],
)
def test_a_bad_labelled_line_is_named(tmp_path, text, header, message):
    with pytest.raises(DataError) as err:
        read_labelled(write(tmp_path / "b.tsv", text), header)
    assert str(err.value) == f"{tmp_path}/{message}"


def test_the_confusion_table_keeps_wide_counts_apart():
    """SST-2's dev set: 797 and 115 under one-character labels printed as '0  797115' (issue 64)."""
    assert confusion_table(["0", "1"], [[797, 115], [84, 1_004]]) == [
        "         0      1",
        "0      797    115",
        "1       84  1,004",
    ]
    assert confusion_table(["negative", "pos"], [[1, 0], [2, 3]]) == [
        "            negative       pos",
        "negative           1         0",
        "pos                2         3",
    ]


def test_accuracy_macro_f1_and_the_confusion_matrix_by_hand():
    gold = [0, 0, 0, 1, 1, 2]
    predicted = [0, 0, 1, 1, 2, 2]
    assert confusion_matrix(predicted, gold, 3) == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    # F1 per class: 2*2/(4+1+0) = 0.8; 2*1/(2+1+1) = 0.5; 2*1/(2+0+1) = 2/3
    scores = classification_scores(predicted, gold, 3)
    assert scores["accuracy"] == pytest.approx(4 / 6)
    assert scores["macro_f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    # a class never seen nor predicted counts 0 (scikit-learn's zero_division=0)
    assert classification_scores([0, 1], [0, 1], 3)["macro_f1"] == pytest.approx(2 / 3)


def test_inputs_are_bert_shaped_and_the_longer_text_is_cut_first():
    tok = Tokenizer.train("word", ["a b c d e f g h"], 100)
    ((ids, segments),) = encode_inputs(tok, ["a b"], [None], max_len=10)[0]
    assert ids == [BOS, *tok.encode("a b"), EOS] and segments == [0, 0, 0, 0]
    inputs, cut = encode_inputs(tok, ["a b c d e f", "a"], ["g h", "b"], max_len=8)
    (ids, segments), (short_ids, short_segments) = inputs
    assert cut == 1  # room for 5 text tokens: a b c stay of the first text (the longer), g h of the second
    assert ids == [BOS, *tok.encode("a b c"), EOS, *tok.encode("g h"), EOS]
    assert segments == [0, 0, 0, 0, 0, 1, 1, 1]
    assert short_ids == [BOS, *tok.encode("a"), EOS, *tok.encode("b"), EOS] and short_segments == [0, 0, 0, 1, 1]


def test_pooling_ignores_padding():
    h = torch.arange(24.0).reshape(2, 3, 4)
    valid = torch.tensor([[True, True, False], [True, True, True]])
    assert torch.equal(FirstTokenPooling()(h, valid), h[:, 0])
    assert torch.equal(MeanPooling()(h, valid), torch.stack([h[0, :2].mean(0), h[1].mean(0)]))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_classifier_gives_the_same_logits_with_or_without_padding(pooling):
    torch.manual_seed(0)
    model = build_model(
        *sized(
            arch="encoder_only",
            vocab_size=20,
            stack=dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0),
            n_classes=3,
            classifier=dict(pooling=pooling),
            n_segments=2,
        )
    ).eval()
    ids = torch.tensor([[BOS, 5, 6, EOS, 7, EOS]])
    segments = torch.tensor([[0, 0, 0, 0, 1, 1]])
    padded = torch.cat([ids, torch.full((1, 3), PAD)], 1)
    alone = model.classify(ids, segments)
    assert torch.allclose(
        model.classify(padded, torch.cat([segments, torch.zeros(1, 3, dtype=torch.long)], 1)), alone, atol=1e-6
    )
    assert not torch.allclose(model.classify(ids, torch.zeros_like(ids)), alone, atol=1e-3)  # segments count


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("head", ["pooled", "linear"])
def test_the_classifier_part_is_the_head_its_fields_name(pooling, head):
    """model.classifier: logits = W_c tanh(W_p pool(h) + b_p) + b_c (pooled) or W_c pool(h) + b_c
    (linear), pool the first real position's state or the mean of the real ones, by hand."""
    torch.manual_seed(0)
    model = build_model(
        *sized(
            arch="encoder_only",
            vocab_size=20,
            stack=dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0),
            n_classes=3,
            classifier=dict(pooling=pooling, head=head),
        )
    ).eval()
    ids = torch.tensor([[BOS, 5, 6, EOS, PAD], [BOS, 7, EOS, PAD, PAD]])
    h, real = model.encode(ids), (ids != PAD).unsqueeze(-1)
    pooled = h[:, 0] if pooling == "cls" else (h * real).sum(1) / real.sum(1)
    out = model.classifier.out
    if head == "pooled":
        pooled = torch.tanh(model.classifier.pool(pooled))
    assert torch.allclose(model.classify(ids), pooled @ out.weight.T + out.bias, atol=1e-6)
    assert {name.split(".")[0] for name, _ in model.classifier.named_parameters()} == (
        {"pool", "out"} if head == "pooled" else {"out"}
    )


def sentiment_tsv(path, n: int, seed: int, labels=("pos", "neg")):
    """Texts whose label is decided by one word among neutral ones."""
    rng = random.Random(seed)
    neutral = "the film plot was a and it very quite long".split()
    cue = {"pos": "great", "neg": "awful", "meh": "fine"}
    lines = []
    for i in range(n):
        label = labels[i % len(labels)]
        words = rng.sample(neutral, 5) + [cue[label]]
        rng.shuffle(words)
        lines.append(f"{' '.join(words)}\t{label}\n")
    return write(path, "".join(lines))


CONFIG = """\
model: {{arch: encoder_only, stack: {{d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64, dropout: 0.0}}, classifier: {{pooling: {pooling}}},
        positions: {{scheme: learned, max_len: 16}}}}
data: {{task: classification, train: {train}, valid: {valid}, max_len: 16}}
train: {{max_steps: 60, max_tokens: 512, lr_schedule: constant, lr: 3.0e-3, warmup_steps: 1, eval_every: 30,
        log_every: 10, label_smoothing: 0.0, progress: false, early_stop_metric: accuracy}}
"""


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    root = tmp_path_factory.mktemp("classifier")
    config = write(
        root / "c.yaml",
        CONFIG.format(
            pooling="cls",
            train=sentiment_tsv(root / "train.tsv", 200, 1),
            valid=sentiment_tsv(root / "valid.tsv", 40, 2),
        ),
    )
    done = run_cli("train", str(config), "--out", str(root / "run"))
    assert done.returncode == 0, done.stderr
    return root, done


def test_an_encoder_learns_to_classify_through_the_command_line(classifier):
    root, done = classifier
    assert "labelled examples: train 200, valid 40; labels neg, pos; vocabulary 16" in done.stdout
    valid = [
        json.loads(line)
        for line in (root / "run" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["split"] == "valid"
    ]
    assert [v["step"] for v in valid] == [30, 60]
    # throughput in what a classifier's loss counts: examples, not tokens
    train = [
        json.loads(line)
        for line in (root / "run" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["split"] == "train"
    ]
    assert train and all("examples_per_s" in t and "tokens_per_s" not in t for t in train)
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert summary["train_examples"] > 0 and summary["examples_per_s"] > 0
    assert "train_tokens" not in summary and "tokens_per_s" not in summary
    assert valid[-1]["accuracy"] == 1.0 and valid[-1]["macro_f1"] == 1.0 and valid[-1]["valid_loss"] < 0.1
    assert json.loads((root / "run" / "task_state.json").read_text()) == {"labels": ["neg", "pos"], "pairs": False}
    _, _, cfg = load_run(root / "run")
    shape = RunDir(root / "run").read_shape()  # the data's sizes, kept in shape.json
    assert (shape.vocab_size, shape.n_classes, shape.segments) == (16, 2, None)
    assert (cfg.n_segments, cfg.segment_rows(shape), cfg.classifier.pooling) == (0, 0, "cls")
    assert RunDir(root / "run").read_tokenizers()["tgt"] is None


def test_predict_writes_a_label_and_its_probability_per_line(classifier):
    root, _ = classifier
    done = run_cli("predict", str(root / "run"), stdin="the film was great\n\nquite awful it was\n")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["pos", "", "neg"]
    assert all(float(lines[i].split("\t")[1]) > 0.9 for i in (0, 2))
    empty = run_cli("predict", str(root / "run"), stdin="")
    assert (
        empty.returncode == 0 and empty.stdout == "" and empty.stderr == "note: <stdin> is empty: nothing to classify\n"
    )
    record = json.loads(run_cli("predict", str(root / "run"), "--json", stdin="great\n").stdout)
    assert record["label"] == "pos" and sum(record["probabilities"].values()) == pytest.approx(1.0)
    assert list(record["probabilities"]) == ["neg", "pos"]
    refused = run_cli("predict", str(root / "run"), stdin="great\tawful\n")
    assert refused.returncode == 4 and refused.stderr == (
        "error: <stdin>:1: expected one text (the model was trained on single texts), found 2 tab-separated fields\n"
    )
    refused = run_cli("translate", str(root / "run"), stdin="great\n")
    assert refused.returncode == 2 and "`attnlab translate` needs data.task 'translation'" in refused.stderr


def test_evaluate_scores_a_labelled_file_with_its_confusion_matrix(classifier, tmp_path):
    root, _ = classifier
    test = write(tmp_path / "test.tsv", "great film\tpos\nawful film\tneg\nit was awful\tpos\n")
    result = json.loads(run_cli("evaluate", str(root / "run"), "--data", str(test), "--json").stdout)
    # the third line is labelled pos but says awful: predicted neg
    assert (result["accuracy"], result["examples"], result["confusion"]) == (2 / 3, 3, [[1, 0], [1, 1]])
    assert result["macro_f1"] == pytest.approx((2 / 3 + 2 / 3) / 2)  # F1: neg 2/(2+0+1), pos 2/(2+1+0)
    done = run_cli("evaluate", str(root / "run"), "--data", str(test), "--plot", str(tmp_path / "cm.png"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"accuracy  66.67%   macro-F1  0.6667   loss  {result['loss']:.4f}   (3 examples, {test})",
        "confusion matrix (rows: true label, columns: predicted)",
        "       neg  pos",
        "neg      1    0",
        "pos      1    1",
    ]
    from PIL import Image

    with Image.open(tmp_path / "cm.png") as image:
        assert json.loads(image.info["Description"])["counts"] == [[1, 0], [1, 1]]
    unseen = write(tmp_path / "unseen.tsv", "great\tpos\nfine\tmeh\n")
    done = run_cli("evaluate", str(root / "run"), "--data", str(unseen))
    assert done.returncode == 4 and done.stderr == (
        f"error: {unseen}:2: label 'meh' is not one the model was trained on (neg, pos)\n"
    )
    done = run_cli("evaluate", str(root / "run"), "--src", str(test), "--ref", str(test))
    assert done.returncode == 2 and "is evaluated on a file of its own format: give --data FILE" in done.stderr
    done = run_cli("evaluate", str(root / "run"), "--data", str(test), "--oracle-length")
    assert done.returncode == 2 and done.stderr == (
        "error: --oracle-length is for translation runs (--src/--ref or --split); data.task 'classification' "
        "decodes no output sequence to measure\n"
    )


def test_sentence_pairs_train_a_segment_table(tmp_path):
    rng = random.Random(3)
    words = "red blue green cat dog bird".split()
    lines = []
    for i in range(120):  # the label: whether the two texts share their first word
        a, b = rng.sample(words, 2), rng.sample(words, 2)
        b[0] = a[0] if i % 2 else next(w for w in words if w != a[0])
        lines.append(f"{' '.join(a)}\t{' '.join(b)}\t{'same' if i % 2 else 'other'}\n")
    train = write(tmp_path / "pairs.tsv", "".join(lines))
    config = write(
        tmp_path / "c.yaml",
        CONFIG.format(pooling="mean", train=train, valid="null")
        .replace("valid: null, max_len: 16}", "max_len: 16, splits: {n_valid: 20}}")
        .replace("max_steps: 60", "max_steps: 4"),
    )
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    model, tokenizers, cfg = load_run(tmp_path / "run")
    shape = RunDir(tmp_path / "run").read_shape()  # pairs: the data gives 2 segments, the model section none
    assert (shape.segments, cfg.n_segments, cfg.segment_rows(shape)) == (2, 0, 2)
    assert model.embed.segments.weight.shape == (2, 32)
    done = run_cli("predict", str(tmp_path / "run"), "--json", stdin="red cat\tred dog\nblue\n")
    assert done.returncode == 0, done.stderr
    # the same numbers as the model's own forward on BERT's pair input: <bos> a <eos> b <eos>, segments 0 then 1
    tok = tokenizers["src"]
    ids = torch.tensor([[BOS, *tok.encode("red cat"), EOS, *tok.encode("red dog"), EOS]])
    with torch.no_grad():
        expected = model.classify(ids, torch.tensor([[0, 0, 0, 0, 1, 1, 1]])).softmax(-1)[0].tolist()
    record = json.loads(done.stdout.splitlines()[0])
    assert list(record["probabilities"]) == ["other", "same"]
    assert list(record["probabilities"].values()) == pytest.approx(expected, abs=1e-6)
    assert record["label"] == ("same" if expected[1] > expected[0] else "other")


def test_a_label_training_never_saw_is_named_with_its_line(tmp_path):
    train = sentiment_tsv(tmp_path / "train.tsv", 40, 1)
    valid = sentiment_tsv(tmp_path / "valid.tsv", 6, 2, labels=("pos", "neg", "meh"))
    config = write(tmp_path / "c.yaml", CONFIG.format(pooling="cls", train=train, valid=valid))
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 4 and done.stderr == (
        f"error: {valid}:3: label 'meh' is not one the model was trained on (neg, pos)\n"
    )
    config.write_text(
        CONFIG.format(pooling="cls", train=train, valid=valid)
        .replace("encoder_only", "decoder_lm")
        .replace(", classifier: {pooling: cls}", "")
    )
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert (
        done.returncode == 3
        and "model.arch must be 'encoder_only' for data.task 'classification'; got 'decoder_lm'" in done.stderr
    )


def test_inspect_draws_what_cls_attends_to_and_gives_the_prediction(classifier, tmp_path):
    root, _ = classifier
    done = run_cli("inspect", str(root / "run"), "--src", "the film was great", "--out", str(tmp_path / "fig"))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "fig" / "summary.json").read_text())
    assert summary["source_tokens"] == ["<bos>", "the", "film", "was", "great", "<eos>"]
    assert summary["prediction"]["label"] == "pos" and "prediction: pos (" in done.stdout
    model, _, _ = load_run(root / "run")
    p = model.classify(
        torch.tensor([[BOS, *RunDir(root / "run").read_tokenizers()["src"].encode("the film was great"), EOS]])
    ).softmax(-1)[0]
    assert summary["prediction"]["probabilities"]["pos"] == pytest.approx(p[1].item(), abs=1e-6)
    first = summary["modules"]["encoder.layers.0.self_attn"]["first_token"]  # (H, T) rows of [CLS]
    assert len(first) == 2 and all(sum(row) == pytest.approx(1.0, abs=1e-3) for row in first)
    assert sorted(Path(f).name for f in summary["files"]) == ["encoder-0-self.png", "entropy.png", "first-token.png"]


def test_prune_ranks_a_classifiers_heads_by_accuracy(classifier, tmp_path):
    root, _ = classifier
    done = run_cli("prune", str(root / "run"), "--fraction", "0.5", "--json", "--out", str(tmp_path / "pruned"))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.splitlines()[-2])
    full, half = summary["results"]
    assert (full["heads_pruned"], half["heads_pruned"]) == (0, 1)
    assert full["accuracy"] == 1.0 and "accuracy 100.00%" in done.stdout.splitlines()[0]
    assert set(half) >= {"valid_loss", "accuracy", "macro_f1"}
    # the pruned run, its heads cut out of the weights, scores what the gated model scored
    pruned = json.loads(
        run_cli("evaluate", str(tmp_path / "pruned"), "--data", str(root / "valid.tsv"), "--json").stdout
    )
    assert pruned["accuracy"] == half["accuracy"] and pruned["loss"] == pytest.approx(half["valid_loss"], rel=1e-5)


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "great film\tpos\nawful film\n",
            "bad.tsv:2: found 1 tab-separated fields; expected 2 (text, label), as on line 1",
        ),
        ("great film\tpos\nawful film\t\n", "bad.tsv:2: empty label"),
    ],
)
def test_a_bad_labelled_file_at_the_command_line_is_one_line(classifier, tmp_path, text, message):
    root, _ = classifier
    done = run_cli("evaluate", str(root / "run"), "--data", str(write(tmp_path / "bad.tsv", text)))
    assert done.returncode == 4 and done.stderr == f"error: {tmp_path}/{message}\n"
