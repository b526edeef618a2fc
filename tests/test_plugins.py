"""Model families and tasks as plug-ins: the registries, capabilities, and, registered from outside
the package, a bigram language model (a new family on a built-in task) and a bag-of-embeddings
sentiment classifier (a new family and a new task) that train through the normal command line; a
keyword classifier (a new task on a built-in family) whose explorer page and inspect view are its
own, in this module; and
docs/extending.md's walk-through run as written (its code blocks are the modules and configs these
tests use, its commands are run and its numbers checked): a task without a vocabulary, which
declares no tokenizer and counts series, a linear family and a family with an attention stack."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import re
import shlex
import shutil
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
import torch
import torch.nn.functional as F
from starlette.testclient import TestClient
from torch import nn

from attnlab import FAMILIES, ConfigError, build_model, model_config, register_family
from attnlab.analysis.capture import capture_attention
from attnlab.analysis.heads import head_entropy
from attnlab.analysis.inspect import module_entry
from attnlab.config import at_least
from attnlab.data.corpora import read_input_lines, read_tsv
from attnlab.data.tokenizers import PAD, Tokenizer
from attnlab.models import INPUT_KINDS, Capabilities, FamilyConfig, ModelFamily, StackConfig
from attnlab.models import transformer as parts
from attnlab.models.shape import DataShape
from attnlab.nn.tensor_plan import COLUMNS, ROWS, TensorPlan, megatron
from attnlab.runs.checkpoint import load_run
from attnlab.runs.run_dir import RunDir
from attnlab.runs.train_config import TrainConfig
from attnlab.serve.app import create_app
from attnlab.serve.explorer import Explorer
from attnlab.tasks import TASKS, Batching, EvaluatesFiles, EvaluatesSplits, Predicts, Task, TaskConfig, register_task
from attnlab.tasks.abilities import PredictsLabels
from attnlab.views import VIEWS, Explorable, Inspectable, Page, register_view, tasks_with
from attnlab.views.session import attention_maps

from helpers import run_cli


@dataclass(frozen=True)
class BigramConfig(FamilyConfig):
    """A bigram language model: each token's embedding predicts the next token."""

    d_model: int = 16

    def check(self) -> None:
        at_least("d_model", self.d_model, 1)


class BigramLM(nn.Module):
    def __init__(self, cfg: BigramConfig, shape: DataShape) -> None:
        super().__init__()
        vocab_size = shape.need("vocab_size", "test_bigram")
        self.pad_id = shape.pad_id
        self.embed = nn.Embedding(vocab_size, cfg.d_model)
        self.generator = nn.Linear(cfg.d_model, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, V) logits of the next token."""
        return self.generator(self.embed(ids))


class BigramFamily(ModelFamily):
    name = "test_bigram"
    config = BigramConfig
    capabilities = Capabilities(encoder=False, decoder=True, incremental_decoding=False, attention_weights=False)

    @staticmethod
    def build(cfg: BigramConfig, shape: DataShape) -> BigramLM:
        return BigramLM(cfg, shape)


# -- a new family and a new task: a bag-of-embeddings sentiment classifier ------------------------


@dataclass(frozen=True)
class BagConfig(FamilyConfig):
    """The mean of a text's word embeddings, then a linear map to the classes."""

    d_model: int = 8


class BagOfEmbeddings(nn.Module):
    def __init__(self, cfg: BagConfig, shape: DataShape) -> None:
        super().__init__()
        self.embed = nn.Embedding(shape.need("vocab_size", "test_bag"), cfg.d_model, padding_idx=shape.pad_id)
        self.classify = nn.Linear(cfg.d_model, shape.need("n_classes", "test_bag"))
        self.pad_id = shape.pad_id

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, n_classes) logits."""
        real = (ids != self.pad_id).unsqueeze(-1)  # (B, T, 1)
        mean = (self.embed(ids) * real).sum(1) / real.sum(1).clamp(min=1)  # (B, d_model)
        return self.classify(mean)


class BagFamily(ModelFamily):
    name = "test_bag"
    config = BagConfig
    capabilities = Capabilities(encoder=True, decoder=False, incremental_decoding=False, attention_weights=False)

    @staticmethod
    def build(cfg: BagConfig, shape: DataShape) -> BagOfEmbeddings:
        return BagOfEmbeddings(cfg, shape)


@dataclass(frozen=True)
class SentimentConfig(TaskConfig):
    """``text TAB label`` lines; the last ``n_valid`` training lines are held out."""

    train: Optional[str] = None
    n_valid: int = 10
    vocab_size: int = 100


@dataclass
class LabelledBatch:
    ids: torch.Tensor  # (B, T)
    labels: torch.Tensor  # (B,)

    @property
    def n_targets(self) -> int:
        return len(self.labels)  # the loss sums over examples

    def to(self, device):
        return LabelledBatch(self.ids.to(device), self.labels.to(device))


@dataclass
class LabelledData:
    tokenizers: dict
    splits: dict[str, list[tuple[list[int], int]]]
    seed: int
    batch_size: int

    def epoch_batches(self, epoch: int) -> list[LabelledBatch]:
        order = list(range(len(self.splits["train"])))
        random.Random(self.seed * 1000 + epoch).shuffle(order)
        return self._batches([self.splits["train"][i] for i in order])

    def eval_batches(self, split: str) -> list[LabelledBatch]:
        return self._batches(self.splits[split])

    def _batches(self, examples) -> list[LabelledBatch]:
        out = []
        for start in range(0, len(examples), self.batch_size):
            chunk = examples[start : start + self.batch_size]
            ids = torch.full((len(chunk), max(len(i) for i, _ in chunk)), PAD)
            for row, (i, _) in enumerate(chunk):
                ids[row, : len(i)] = torch.tensor(i)
            out.append(LabelledBatch(ids, torch.tensor([label for _, label in chunk])))
        return out


class Sentiment(Task[LabelledData, LabelledBatch]):
    """A task made from its data section (``Sentiment(cfg)``, or ``cfg.task``): what it does reads
    ``self.cfg``; what the registry reads (name, needs, ...) is declared on the class."""

    name = "test_sentiment"
    config = SentimentConfig
    needs = {"encoder": True, "decoder": False}
    metrics = {"valid_loss": True, "accuracy": False}
    commands = ()
    tokenizers = ("src",)
    cfg: SentimentConfig

    def prepare(self, batching, tokenizers=None, state=None):
        cfg = self.cfg
        pairs = read_tsv(cfg.train)
        labels = sorted({label for _, label in pairs})
        if tokenizers is None:
            tokenizers = {"src": Tokenizer.train("word", [text for text, _ in pairs], cfg.vocab_size), "tgt": None}
        examples = list(
            zip(tokenizers["src"].encode_batch([t for t, _ in pairs]), [labels.index(label) for _, label in pairs])
        )
        data = LabelledData(
            tokenizers,
            {"train": examples[: -cfg.n_valid], "valid": examples[-cfg.n_valid :]},
            batching.seed,
            batching.batch_size,
        )
        data.labels = labels
        return data

    def data_shape(self, data=None):
        return DataShape(
            vocab_size=self.vocabulary(data, "src"), n_classes=len(data.labels) if data is not None else 2, pad_id=PAD
        )

    def logits(self, model, ids):
        """(B, T) ids -> (B, n_classes) logits."""
        return model(ids)

    def loss(self, model, batch, label_smoothing, amp):
        with amp():
            logits = self.logits(model, batch.ids).float()
        return (
            F.cross_entropy(logits, batch.labels, reduction="sum", label_smoothing=label_smoothing),
            F.cross_entropy(logits, batch.labels, reduction="sum"),
        )

    @torch.no_grad()
    def validate(self, model, data, device, amp, n_decoded):
        model.eval()
        nll = right = 0.0
        for batch in data.eval_batches("valid"):
            batch = batch.to(device)
            logits = self.logits(model, batch.ids)
            nll += F.cross_entropy(logits, batch.labels, reduction="sum").item()
            right += (logits.argmax(-1) == batch.labels).sum().item()
        n = len(data.splits["valid"])
        return {"valid_loss": nll / n, "accuracy": right / n}

    def describe(self, data):
        return (
            f"labelled texts: train {len(data.splits['train'])}, valid {len(data.splits['valid'])}; "
            f"labels {', '.join(data.labels)}"
        )


@pytest.fixture(autouse=True, scope="module")
def plugins_registered():
    """Registered for this module's tests only: other tests list the families and tasks (in error
    messages)."""
    register_family(BigramFamily)
    register_family(BagFamily)
    register_task(Sentiment)
    register_task(Keyword)
    register_task(Mute)
    yield
    del FAMILIES[BigramFamily.name], FAMILIES[BagFamily.name], TASKS[Sentiment.name], TASKS[Keyword.name]
    del TASKS[Mute.name]
    del VIEWS[Keyword]


def test_the_built_in_families_and_their_capabilities():
    assert list(FAMILIES)[:4] == ["encoder_decoder", "decoder_lm", "encoder_only", "rnn"]
    can = {name: FAMILIES[name].capabilities for name in ("encoder_decoder", "decoder_lm", "encoder_only", "rnn")}
    assert [(c.encoder, c.decoder, c.incremental_decoding, c.attention_weights) for c in can.values()] == [
        (True, True, True, True),
        (False, True, True, True),
        (True, False, False, True),
        (True, True, True, False),
    ]
    assert model_config(arch="rnn").capabilities is can["rnn"]


def test_a_family_owns_its_fields_and_round_trips():
    cfg = model_config(arch="test_bigram", d_model=4)
    assert cfg.to_dict() == {"arch": "test_bigram", "d_model": 4}
    assert model_config(cfg.to_dict()) == cfg
    assert sum(p.numel() for p in build_model(cfg, DataShape(vocab_size=11)).parameters()) == 11 * 4 + 4 * 11 + 11
    with pytest.raises(ConfigError, match=r"model.arch 'test_bigram' has no field 'n_heads'; its fields: d_model$"):
        model_config(arch="test_bigram", n_heads=2)
    # the vocabulary is the data's (models/shape.py): not a field of the family, refused in its section
    with pytest.raises(ConfigError, match=r"^model.vocab_size is set by the data, not the model section: remove it$"):
        model_config(arch="test_bigram", vocab_size=11, d_model=4)
    with pytest.raises(ConfigError, match=r"^test_bigram needs vocab_size from its data, which gives none$"):
        build_model(cfg, DataShape())


def test_registering_a_second_family_under_a_taken_name_is_refused():
    class Impostor(BigramFamily):
        pass

    with pytest.raises(ValueError, match="a model family named 'test_bigram' is already registered"):
        register_family(Impostor)


def test_a_family_from_outside_the_package_trains_through_the_command_line(tmp_path):
    (tmp_path / "text.txt").write_text("abab abab abab abab\n" * 60)
    config = tmp_path / "bigram.yaml"
    config.write_text(f"""\
model: {{arch: test_bigram, d_model: 8}}
data: {{format: text, train: {tmp_path}/text.txt, text: {{tokenizer: char}}, block_size: 16}}
train: {{max_steps: 30, batch_size: 8, lr_schedule: constant, lr: 0.05, warmup_steps: 1, eval_every: 30,
        log_every: 1, progress: false}}
""")
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "model: test_bigram, 136 parameters" in done.stdout  # V = 4 specials + a, b, space, newline: 2 x 8 x 8 + 8
    losses = [
        json.loads(line)["loss"]
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["split"] == "train"
    ]
    assert len(losses) == 30 and losses[-1] < 0.5 * losses[0]  # from ln 8 towards what a bigram can know of "abab abab"
    model, _, cfg = load_run(tmp_path / "run")
    assert isinstance(model, BigramLM) and cfg.arch == "test_bigram"
    refused = run_cli("translate", str(tmp_path / "run"), stdin="a b\n")  # the task does not translate
    assert refused.returncode == 2 and refused.stderr == (
        f"error: {tmp_path / 'run'} is a run of data.task 'language_model'; `attnlab translate` needs data.task "
        f"'translation' or 'masked_translation' (this run's commands: generate, score, inspect, prune)\n"
    )
    refused = run_cli("generate", str(tmp_path / "run"), "--seed", "1")  # the task generates; the family has no cache
    assert refused.returncode == 2 and refused.stderr == (
        f"error: {tmp_path / 'run'} holds a model of arch 'test_bigram'; `attnlab generate` needs 'decoder_lm' or 'transformer_xl'\n"
    )


SENTIMENT = """\
model: {{arch: test_bag, d_model: 8}}
data: {{task: test_sentiment, train: {train}, n_valid: 20}}
train: {{max_steps: 40, batch_size: 16, lr_schedule: constant, lr: 0.05, warmup_steps: 1, eval_every: 20,
        log_every: 1, label_smoothing: 0.0, progress: false, early_stop_metric: accuracy}}
"""


def sentiment_file(tmp_path, n: int = 120):
    """Texts whose label is decided by one word (good / bad) among neutral ones."""
    rng = random.Random(0)
    neutral = "the film plot was a and it very quite".split()
    lines = []
    for i in range(n):
        label = ("pos", "neg")[i % 2]
        words = rng.sample(neutral, 4) + [("good" if label == "pos" else "bad")]
        rng.shuffle(words)
        lines.append(f"{' '.join(words)}\t{label}\n")
    path = tmp_path / "sentiment.tsv"
    path.write_text("".join(lines))
    return path


def test_a_task_and_a_family_from_outside_the_package_train_through_the_command_line(tmp_path):
    config = tmp_path / "sentiment.yaml"
    config.write_text(SENTIMENT.format(train=sentiment_file(tmp_path)))
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "labelled texts: train 100, valid 20; labels neg, pos" in done.stdout
    # V = 4 specials + 11 words: embeddings 15 x 8, classifier 8 x 2 + 2
    assert "model: test_bag, 138 parameters" in done.stdout
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [20, 40] and valid[-1]["accuracy"] == 1.0
    train = [r["loss"] for r in records if r["split"] == "train"]
    assert len(train) == 40 and train[0] == pytest.approx(math.log(2), abs=0.05) and train[-1] < 0.3
    best = json.loads((tmp_path / "run" / "checkpoints" / "best.json").read_text())
    assert best["metric"] == "accuracy" and best["value"] == 1.0
    model, tokenizers, cfg = load_run(tmp_path / "run")
    assert isinstance(model, BagOfEmbeddings) and cfg.arch == "test_bag" and tokenizers["tgt"] is None
    # the data's sizes are kept beside the config (shape.json), which the model was built from
    assert RunDir(tmp_path / "run").read_shape() == DataShape(vocab_size=15, n_classes=2, pad_id=PAD)
    assert model.classify.out_features == 2 and model.embed.num_embeddings == 15
    ids = torch.tensor([tokenizers["src"].encode("the plot was good"), tokenizers["src"].encode("the plot was bad")])
    assert model(ids).argmax(-1).tolist() == [1, 0]  # pos, neg (labels sorted: neg = 0)
    for command, needs in (
        ("translate", "'translation' or 'masked_translation'"),
        (
            "inspect",
            "'translation' or 'language_model' or 'classification' or 'masked_lm' or "
            "'image_classification' or 'captioning' or 'visual_qa' or 'encoder' or 'image_encoder' or "
            "'audio_classification' or 'speech_recognition' or 'test_keyword'",
        ),
    ):  # this module's keyword task has an inspect view
        refused = run_cli(
            command, str(tmp_path / "run"), *(["--split", "valid"] if command == "inspect" else []), stdin="good\n"
        )
        assert refused.returncode == 2 and refused.stderr == (
            f"error: {tmp_path / 'run'} is a run of data.task 'test_sentiment'; `attnlab {command}` needs data.task "
            f"{needs} (this run's commands: )\n"
        )


def test_a_task_refuses_what_it_cannot_train_and_fields_it_does_not_have(tmp_path):
    train = sentiment_file(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(SENTIMENT.format(train=train).replace("test_bag", "rnn"))
    done = run_cli("train", str(config), "--out", str(tmp_path / "r"))
    assert done.returncode == 3 and done.stderr == (
        f"error: {config}: model.arch must be 'encoder_only' or 'test_bag' for data.task 'test_sentiment'; got 'rnn'\n"
    )
    done = run_cli("train", str(config), "--out", str(tmp_path / "r"), "--set", "data.block_size=4")
    assert (
        done.returncode == 3
        and "--set 'data.block_size=4': unknown field 'block_size' in section 'data'" in done.stderr
    )
    config.write_text(SENTIMENT.format(train=train).replace("n_valid: 20", "n_vaild: 20"))
    done = run_cli("train", str(config), "--out", str(tmp_path / "r"))
    assert done.returncode == 3 and done.stderr == (
        f"error: {config}: data.task 'test_sentiment' has no field 'n_vaild' (did you mean 'n_valid'?); its fields: "
        f"train, n_valid, vocab_size\n"
    )
    assert not (tmp_path / "r").exists()


# -- a new task with its own explorer page and inspect view, in this one module -------------------


@dataclass(frozen=True)
class KeywordConfig(SentimentConfig):
    """The sentiment task's fields (a config class belongs to one task)."""


class Keyword(PredictsLabels, Sentiment):
    """The sentiment texts, classified by an attention model (arch encoder_only) from its first
    position; its runs are explored and inspected through :class:`KeywordView`. Of the optional
    abilities (tasks/abilities.py) it has one, :class:`Predicts`: `attnlab predict` reads a text a line
    (its class names and the options it takes, none, from :class:`PredictsLabels`); it scores no
    file of its own format (no :class:`EvaluatesFiles`), so `attnlab evaluate` refuses its runs."""

    name = "test_keyword"
    config = KeywordConfig
    commands = ("inspect", "predict", "evaluate")

    def saved_state(self, data):
        return {"labels": data.labels}  # the names of the page's classes, and of predict's

    def logits(self, model, ids):
        return model.classify(ids)

    @torch.no_grad()
    def predict(self, model, run, inputs, input_file, batch_size, **options):
        """Each line of ``input_file`` (or stdin): its class probabilities."""
        tokenizer = run.read_tokenizers()["src"]
        lines = read_input_lines(input_file, "classify")
        model.eval()
        return [
            (None, self.logits(model, torch.tensor([tokenizer.encode(line)]))[0].softmax(-1).tolist()) for line in lines
        ]


@dataclass(frozen=True)
class MuteConfig(SentimentConfig):
    """The sentiment task's fields again (a config class belongs to one task)."""


class Mute(Sentiment):
    """A task whose commands name `predict` and `evaluate` but that has neither ability: the
    commands refuse its runs in one line, by asking the abilities."""

    name = "test_mute"
    config = MuteConfig
    commands = ("predict", "evaluate")


@register_view(Keyword)
class KeywordView:
    """A keyword classifier's page: the ``top`` classes, every map, and the ``focus``, the word the
    first position attends to most in the last layer (heads averaged); `inspect` writes the focus
    and each module's entropies."""

    page = Page(fields={"top": 1}, output="classes")

    def example(self, run, tokenizers):
        return "the plot was good"

    def read(self, model, tokenizer, text):
        """The ids of ``text``, the logits of (1, n_classes), the captured maps and the focus."""
        ids = tokenizer.encode(text)
        with capture_attention(model) as captured:
            logits = model.classify(torch.tensor([ids], device=next(model.parameters()).device))
        records = captured.last()
        last = max(records.values(), key=lambda r: r.layer).probs[0].mean(0)  # (T, T), heads averaged
        return ids, logits, records, tokenizer.id_tokens(ids)[int(last[0].argmax())]

    def answer(self, session, text, top):
        ids, logits, records, focus = self.read(session.model, session.tokenizers["src"], text)
        labels = session.tokenizers["src"].id_tokens(ids)
        ranked = session.probabilities(logits[0])
        return {
            "source_tokens": labels,
            "attention": attention_maps(records, lambda r: (labels, labels)),
            "outputs": ranked["outputs"][:top],
            "chosen": 0,
            "focus": focus,
        }

    def inspect(self, inspection):
        inspection.refuse_question()
        inspection.refuse_target("a keyword classifier reads --src alone")
        _, _, records, focus = self.read(inspection.model, inspection.tokenizers["src"], inspection.text)
        out = inspection.figures()
        modules = {name: module_entry(r, head_entropy(r.probs)) for name, r in records.items()}
        summary = {"focus": focus, "modules": modules, "out": str(out), "files": []}
        (out / "summary.json").write_text(json.dumps(summary))
        return summary


KEYWORD = """\
model: {{arch: encoder_only, stack: {{d_model: 8, n_heads: 2, n_layers: 1, d_ff: 16, dropout: 0.0}}, positions: {{max_len: 16}}}}
data: {{task: test_keyword, train: {train}, n_valid: 20}}
train: {{max_steps: 10, batch_size: 16, lr_schedule: constant, lr: 0.01, warmup_steps: 1, eval_every: 10,
        log_every: 5, label_smoothing: 0.0, progress: false, early_stop_metric: accuracy}}
"""


@pytest.fixture(scope="module")
def keyword_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("keyword")
    config = root / "keyword.yaml"
    config.write_text(KEYWORD.format(train=sentiment_file(root)))
    done = run_cli("train", str(config), "--out", str(root / "run"))
    assert done.returncode == 0, done.stderr
    return root / "run"


def test_a_task_from_outside_the_package_brings_its_own_explorer_page(keyword_run):
    """Its view's fields are the page's, its example the first input, and its answer the API's,
    with the maps of the classifier's own forward."""
    api = TestClient(create_app([Explorer(keyword_run)]), base_url="http://127.0.0.1")
    [info] = api.get("/api/info").json()["runs"]
    assert (info["task"], info["options"], info["input"], info["output"], info["steps"], info["example"]) == (
        "test_keyword",
        {"top": 1},
        "text",
        "classes",
        "none",
        "the plot was good",
    )
    reply = api.post("/api/run", json={"text": "the plot was good", "top": 2}).json()
    model, tokenizers, _ = load_run(keyword_run)
    ids = tokenizers["src"].encode("the plot was good")
    with capture_attention(model) as captured:
        p = model.classify(torch.tensor([ids]))[0].softmax(-1)
    [record] = captured.last().values()
    assert reply["task"] == "test_keyword" and reply["source_tokens"] == ["the", "plot", "was", "good"]
    assert [o["label"] for o in reply["outputs"]] == [["neg", "pos"][i] for i in p.argsort(descending=True)]
    assert [o["probability"] for o in reply["outputs"]] == pytest.approx(sorted(p.tolist(), reverse=True))
    torch.testing.assert_close(torch.tensor(reply["attention"][0]["probs"]), record.probs[0])
    assert reply["focus"] == reply["source_tokens"][int(record.probs[0].mean(0)[0].argmax())]
    assert len(api.post("/api/run", json={"text": "the plot was good"}).json()["outputs"]) == 1  # top's default
    refused = api.post("/api/run", json={"text": "good", "beam": 2})
    assert refused.status_code == 400 and refused.json() == {
        "error": "unknown field 'beam'; a test_keyword run reads run, text, heads_off, top"
    }


def test_a_task_from_outside_the_package_brings_its_own_inspect_view(keyword_run, tmp_path):
    done = run_cli("inspect", str(keyword_run), "--src", "the plot was good", "--out", str(tmp_path / "fig"))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "fig" / "summary.json").read_text())
    model, tokenizers, _ = load_run(keyword_run)
    with capture_attention(model) as captured:
        model.classify(torch.tensor([tokenizers["src"].encode("the plot was good")]))
    [(name, record)] = captured.last().items()
    assert summary["modules"][name]["entropy"] == [round(float(e), 4) for e in head_entropy(record.probs)]
    assert summary["focus"] == ["the", "plot", "was", "good"][int(record.probs[0].mean(0)[0].argmax())]
    assert done.stdout.startswith(f"{name:<34} entropy per head") and done.stdout.endswith(f"in {tmp_path / 'fig'}\n")
    tgt = run_cli("inspect", str(keyword_run), "--src", "good", "--tgt", "x", "--out", str(tmp_path / "t"))
    assert (
        tgt.returncode == 2
        and tgt.stderr == "error: --tgt is for models with a decoder; a keyword classifier reads --src alone\n"
    )


def test_a_task_from_outside_the_package_predicts_by_its_ability_and_evaluate_refuses_what_it_lacks(keyword_run):
    """The keyword task is a Predicts (found by isinstance), so `attnlab predict` gives each line's
    best class and its probability, as the model's own softmax; it is no EvaluatesFiles, so
    `attnlab evaluate --data` refuses its run in one line naming the task."""
    task = RunDir(keyword_run).read_config()[1].task
    assert isinstance(task, Predicts) and not isinstance(task, (EvaluatesFiles, EvaluatesSplits))
    assert task.class_names(RunDir(keyword_run)) == ["neg", "pos"] and task.predict_options == ()
    done = run_cli("predict", str(keyword_run), stdin="the plot was good\nthe plot was bad\n")
    assert done.returncode == 0, done.stderr
    model, tokenizers, _ = load_run(keyword_run)
    expected = []
    for text in ("the plot was good", "the plot was bad"):
        p = model.classify(torch.tensor([tokenizers["src"].encode(text)]))[0].softmax(-1)
        expected.append(f"{['neg', 'pos'][int(p.argmax())]}\t{p.max().item():.4f}")
    assert done.stdout.splitlines() == expected
    refused = run_cli("evaluate", str(keyword_run), "--data", "labelled.tsv")
    assert refused.returncode == 2 and refused.stderr == (
        "error: --data is for tasks that score a file in their own format; data.task 'test_keyword' reads none: "
        "give --src and --ref, or --split\n"
    )


def test_a_task_whose_commands_outrun_its_abilities_is_refused_in_one_line(keyword_run, tmp_path):
    """The mute task's commands name predict, but it is no Predicts: `attnlab predict` asks the
    ability and refuses its run in one line (exit 2) before loading the model."""
    run = tmp_path / "run"
    shutil.copytree(keyword_run, run)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("task: test_keyword", "task: test_mute"))
    task = RunDir(run).read_config()[1].task
    assert type(task) is Mute and not any(isinstance(task, a) for a in (Predicts, EvaluatesFiles, EvaluatesSplits))
    refused = run_cli("predict", str(run), stdin="good\n")
    assert refused.returncode == 2 and refused.stderr == (
        f"error: {run} is a run of data.task 'test_mute', which lists `predict` among its commands but predicts no "
        f"classes (it has no predict, class_names and predict_options)\n"
    )
    refused = run_cli("evaluate", str(run), "--data", "labelled.tsv")
    assert refused.returncode == 2 and refused.stderr == (
        "error: --data is for tasks that score a file in their own format; data.task 'test_mute' reads none: "
        "give --src and --ref, or --split\n"
    )


def test_every_task_that_inspect_serves_has_an_inspect_view_and_serve_finds_its_page():
    """`inspect` serves the tasks whose ``commands`` name it; each has an Inspectable view, and the
    built-in explorable tasks are those serve explored before the views."""
    assert tasks_with(Inspectable) == [name for name, task in TASKS.items() if "inspect" in task.commands]
    assert tasks_with(Explorable)[:8] == [
        "translation",
        "language_model",
        "classification",
        "masked_lm",
        "image_classification",
        "captioning",
        "visual_qa",
        "encoder",
    ]


def test_a_task_whose_data_sets_a_vocabulary_size_must_declare_its_tokenizer(tmp_path):
    """Registering a task with no tokenizer and the default data_shape (a tokenizer's vocabulary) is
    refused; a data_shape that reads the vocabulary of a tokenizer the task does not declare (it
    would not be saved with a run) is refused where the fields are first planned, before any run."""

    class Forgetful(Task):
        name = "test_forgetful"
        needs = {"encoder": True}

    with pytest.raises(
        TypeError,
        match=r"task 'test_forgetful' declares no tokenizer, so its data sets no "
        r"vocabulary: define its data_shape\(self, data=None\)",
    ):
        register_task(Forgetful)
    assert "test_forgetful" not in TASKS

    class Undeclared(Sentiment):
        name = "test_undeclared"
        tokenizers = ()

    register_task(Undeclared)
    try:
        config = tmp_path / "c.yaml"
        config.write_text(SENTIMENT.format(train=sentiment_file(tmp_path)).replace("test_sentiment", "test_undeclared"))
        with pytest.raises(
            TypeError,
            match=r"task 'test_undeclared' sets a vocabulary size from its 'src' tokenizer: "
            r"declare the roles of the tokenizers it saves",
        ):
            run_cli("train", str(config), "--out", str(tmp_path / "run"))
        assert not (tmp_path / "run").exists()
    finally:
        del TASKS[Undeclared.name]


# -- docs/extending.md, run as written ------------------------------------------------------------

EXTENDING = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


@dataclass
class Block:
    """A fenced block of the walk-through: its language, the markdown line its text starts on, the
    text, and the file it is (its first line, ``# NAME ...``)."""

    language: str
    line: int
    text: str

    @property
    def name(self) -> str:
        return self.text.split("\n", 1)[0].removeprefix("# ").split()[0]


def walkthrough(section: str, language: str) -> list[Block]:
    """The fenced ``language`` blocks of the walk-through's ``## section``, in order."""
    blocks, heading, fence = [], None, None
    for number, line in enumerate(EXTENDING.read_text().splitlines(), 1):
        if fence is None and line.startswith("## "):
            heading = line[3:]
        elif fence is None and line.startswith("```"):
            fence = Block(line[3:], number + 1, "")
        elif fence is not None and line == "```":
            blocks += [fence] if heading == section and fence.language == language else []
            fence = None
        elif fence is not None:
            fence.text += line + "\n"
    assert fence is None, f"{EXTENDING}: a fence opened at line {fence.line - 1} is not closed"
    return blocks


@contextlib.contextmanager
def modules_of(section: str):
    """The section's Python blocks run as the modules they name, each line numbered as in the
    markdown (a traceback points into the doc); what they register is removed afterwards."""
    families, tasks, kinds, modules = set(FAMILIES), set(TASKS), set(INPUT_KINDS), {}
    try:
        for block in walkthrough(section, "python"):
            name = "extending_" + Path(block.name).stem
            modules[name] = sys.modules[name] = types.ModuleType(name)
            code = compile("\n" * (block.line - 1) + block.text, str(EXTENDING), "exec")  # the doc's line numbers
            exec(code, modules[name].__dict__)
        yield types.SimpleNamespace(**{name.removeprefix("extending_"): m for name, m in modules.items()})
    finally:
        for name in set(FAMILIES) - families:
            del FAMILIES[name]
        for name in set(TASKS) - tasks:
            del TASKS[name]
        for name in set(INPUT_KINDS) - kinds:
            del INPUT_KINDS[name]
        for name in modules:
            del sys.modules[name]


def follow(section: str, where: Path) -> None:
    """Write the section's YAML blocks to the files they name in ``where`` and run its console
    blocks' `$ attnlab` commands there: each succeeds and prints the lines the doc shows under it,
    in order."""
    for block in walkthrough(section, "yaml"):
        (where / block.name).write_text(block.text)
    with contextlib.chdir(where):
        for block in walkthrough(section, "console"):
            for command in re.split(r"^\$ ", block.text, flags=re.M)[1:]:
                line, *shown = command.splitlines()
                done = run_cli(*shlex.split(line)[1:])
                assert done.returncode == 0, f"{line}: {done.stderr}"
                printed = iter(done.stdout.splitlines())
                for expected in shown:  # a subsequence of what is printed
                    assert any(is_shown(expected, p) for p in printed), f"{line}: no {expected!r} in\n{done.stdout}"


def is_shown(expected: str, printed: str) -> bool:
    """A line the doc shows under a command is a printed line; one ending in '...', its start."""
    return printed.startswith(expected[:-3]) if expected.endswith("...") else printed == expected


def trend_data(trend):
    """The walk-through's series, prepared as `attnlab train` prepares them with its trend.yaml."""
    return trend.TrendConfig().task.prepare(Batching(max_tokens=0, batch_size=20, seed=TrainConfig().seed))


def first_loss_by_hand(model_cfg, shape, data) -> float:
    """The mean cross-entropy of the initial model (built after torch.manual_seed(train.seed), as
    `attnlab train` builds it) on the first training batch of series."""
    torch.manual_seed(TrainConfig().seed)
    model = build_model(model_cfg, shape)
    batch = data.epoch_batches(0)[0]
    return F.cross_entropy(model(batch.series), batch.labels).item()


def train_records(run: Path, split: str) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["split"] == split]


def test_the_walkthrough_adds_a_task_without_a_vocabulary(tmp_path):
    with modules_of("Add a task") as new:
        assert "tokenizers" not in vars(new.trend.Trend) and new.trend.Trend.tokenizers == ()  # the default: none
        follow("Add a task", tmp_path)
        run = tmp_path / "runs" / "trend"
        info = json.loads(run_cli("info", str(tmp_path / "trend.yaml"), "--json").stdout)
        assert info["params_total"] == 4 * 2 + 2  # 4 x 2 weights, 2 biases
        data = trend_data(new.trend)
        losses = [r["loss"] for r in train_records(run, "train")]
        shape = DataShape(input_length=4, n_channels=1, n_classes=2)
        assert new.trend.TrendConfig().task.data_shape() == shape  # the same before the data and after
        by_hand = first_loss_by_hand(model_config(arch="series_linear"), shape, data)
        assert len(losses) == 20 and losses[0] == pytest.approx(by_hand, rel=1e-6)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["train_series"] == 20 * 20 and "train_tokens" not in summary  # 20 updates of 20 series
        assert [r["step"] for r in train_records(run, "train") if "series_per_s" in r] == list(range(1, 21))
        valid = [r["valid_loss"] for r in train_records(run, "valid")]
        assert len(valid) == 2 and valid[-1] < 0.5 * math.log(2)
        assert sorted(p.name for p in run.glob("tokenizer*")) == []
        model, tokenizers, cfg = load_run(run)
        assert tokenizers == {} and isinstance(model, new.series_linear.SeriesLinear)
        assert cfg.to_dict() == {"arch": "series_linear"} and RunDir(run).read_shape() == shape
        assert model.classify.weight.shape == (2, 4)
        held_out = data.splits["valid"]
        assert F.cross_entropy(model(held_out.series), held_out.labels).item() == pytest.approx(min(valid), rel=1e-6)
        up = model.classify.weight[1] - model.classify.weight[0]  # the sum's sign: the direction (1, 1, 1, 1)
        assert F.cosine_similarity(up, torch.ones(4), dim=0) > 0.9
        sized = tmp_path / "sized.yaml"  # the series' length is the data's, never the model section's
        sized.write_text(
            (tmp_path / "trend.yaml")
            .read_text()
            .replace("{arch: series_linear}", "{arch: series_linear, input_length: 1}")
        )
        refused = run_cli("train", str(sized), "--out", str(tmp_path / "r"))
        assert refused.returncode == 3 and refused.stderr == (
            f"error: {sized}: model.input_length is set by the data, not the model section: remove it\n"
        )
        assert not (tmp_path / "r").exists()


def test_the_walkthrough_adds_a_family_with_an_attention_stack(tmp_path):
    (block,) = walkthrough("Add a family", "python")
    assert len([line for line in block.text.splitlines() if line.strip()]) <= 40  # the whole family, imports included
    with modules_of("Add a task") as new, modules_of("Add a family") as family:
        config = family.series_attention.SeriesAttentionConfig
        assert [f.name for f in dataclasses.fields(config)] == ["stack"]  # no field of the stack, no size of the data
        follow("Add a family", tmp_path)
        d, ff, length, classes = 8, 16, 4, 2
        by_hand = (
            (d + d)
            + length * d
            + (d * 3 * d + 3 * d)
            + (d * d + d)
            + (d * ff + ff + ff * d + d)
            + 2 * 2 * d
            + 2 * d
            + (d * classes + classes)
        )
        info = json.loads(run_cli("info", str(tmp_path / "trend_attention.yaml"), "--json").stdout)
        assert info["params_total"] == by_hand == 682
        run = tmp_path / "runs" / "trend_attention"
        losses = [r["loss"] for r in train_records(run, "train")]
        model_cfg = model_config(arch="series_attention", stack={"n_heads": 4})  # trend_attention.yaml
        shape = DataShape(input_length=4, n_channels=1, n_classes=2)  # the trend task's data
        initial = first_loss_by_hand(model_cfg, shape, trend_data(new.trend))
        assert len(losses) == 40 and losses[0] == pytest.approx(initial, rel=1e-5)
        valid = [r["valid_loss"] for r in train_records(run, "valid")]
        assert len(valid) == 2 and valid[-1] < valid[0] < math.log(2)
        model, _, cfg = load_run(run)
        assert isinstance(model, family.series_attention.SeriesAttention) and cfg.stack.n_heads == 4


def test_the_walkthrough_adds_an_input_type(tmp_path):
    """A kind of input registered by the module that brings it, a family reading it (an encoder
    without positions: a set function) and a task needing it, trained through the command line."""
    with modules_of("Add an input type") as new:
        points = new.point_set.POINTS
        assert INPUT_KINDS["points"] is points and points == "points" and "in no order" in points.about
        follow("Add an input type", tmp_path)
        d, ff = 16, 32
        by_hand = (
            (2 * d + d) + (d * 3 * d + 3 * d) + (d * d + d) + (d * ff + ff) + (ff * d + d) + 3 * 2 * d + (d * 2 + 2)
        )
        info = json.loads(run_cli("info", str(tmp_path / "centroid.yaml"), "--json").stdout)
        assert info["params_total"] == by_hand == 2_338
        run = tmp_path / "runs" / "centroid"
        valid = [r["valid_loss"] for r in train_records(run, "valid")]
        assert len(valid) == 2 and valid[-1] < valid[0] < math.log(2)
        model, _, _ = load_run(run)
        sets = torch.randn(5, 8, 2, generator=torch.Generator().manual_seed(1))
        order = torch.randperm(8, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():  # the same scores for the points in any order (float32 sums in another order)
            torch.testing.assert_close(model(sets[:, order]), model(sets), rtol=0, atol=1e-6)
        other = tmp_path / "other.yaml"
        other.write_text((tmp_path / "centroid.yaml").read_text().replace("arch: point_set", "arch: encoder_only"))
        refused = run_cli("train", str(other), "--out", str(tmp_path / "other"))
        assert refused.returncode == 3 and "model.arch must be 'point_set' for data.task 'centroid'" in refused.stderr
        with pytest.raises(TypeError, match=r"capability inputs must be one of tokens, .*, points \(got 'voxels'\)"):
            Capabilities(
                encoder=True, decoder=False, incremental_decoding=False, attention_weights=False, inputs="voxels"
            )
        with pytest.raises(ValueError, match="an input kind named 'points' is already registered"):
            new.point_set.input_kind("points", "again")
    assert "points" not in INPUT_KINDS  # what the walk-through registered is gone with it


# -- a family with a tensor-parallel plan: train.strategy tp splits it as its model declares ----------

TAGGER_VOCAB = 20


@dataclass(frozen=True)
class TaggerConfig(FamilyConfig):
    """A token tagger: an attention stack, then a two-layer MLP of width ``d_hidden`` at each position;
    its vocabulary (of tokens and of tags) is the data's."""

    d_hidden: int = 32
    stack: StackConfig = StackConfig(d_model=16, n_heads=4, n_layers=2, d_ff=32, dropout=0.0, norm="pre")

    def check(self) -> None:
        self.family.check_stack(self.stack)


class Tagger(nn.Module):
    def __init__(self, cfg: TaggerConfig, shape: DataShape) -> None:
        super().__init__()
        vocab_size = shape.need("vocab_size", "test_tagger")
        self.embed = nn.Embedding(vocab_size, cfg.stack.d_model)
        self.encoder = parts.plain_encoder(cfg, cfg.stack.n_layers)
        self.w_in = nn.Linear(cfg.stack.d_model, cfg.d_hidden)
        self.w_out = nn.Linear(cfg.d_hidden, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, V) tag logits."""
        h = self.encoder(self.embed(ids), ids != PAD, torch.arange(ids.shape[1]))  # (B, T, d_model)
        return self.w_out(F.gelu(self.w_in(h)))  # (B, T, d_hidden) -> (B, T, V)


class ShardedTagger(Tagger):
    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of the encoder's layers, and the MLP's: W_in by columns, W_out by rows."""
        return megatron(self, "encoder") | TensorPlan({"w_in": COLUMNS, "w_out": ROWS})


class ShardedTaggerFamily(ModelFamily):
    name = "test_tagger"
    config = TaggerConfig
    capabilities = Capabilities(encoder=True, decoder=False, incremental_decoding=False, attention_weights=True)
    build = staticmethod(ShardedTagger)


@dataclass(frozen=True)
class UnplannedTaggerConfig(TaggerConfig):
    pass


class UnplannedTaggerFamily(ModelFamily):
    name = "test_tagger_without_plan"
    config = UnplannedTaggerConfig
    capabilities = ShardedTaggerFamily.capabilities
    build = staticmethod(Tagger)


@contextlib.contextmanager
def registered(*families: type[ModelFamily]):
    for family in families:
        register_family(family)
    try:
        yield
    finally:
        for family in families:
            del FAMILIES[family.name]


def tagger() -> nn.Module:
    torch.manual_seed(0)
    return build_model(model_config(arch="test_tagger"), DataShape(vocab_size=TAGGER_VOCAB))


def tagger_gradients(model: nn.Module) -> dict:
    """The loss of one fixed batch and the gradients of every parameter, whole."""
    from attnlab.parallel.distributed import whole

    g = torch.Generator().manual_seed(1)
    ids, tags = torch.randint(1, TAGGER_VOCAB, (3, 7), generator=g), torch.randint(0, TAGGER_VOCAB, (3, 7), generator=g)
    loss = F.cross_entropy(model(ids).flatten(0, 1), tags.flatten())
    loss.backward()
    return {"loss": loss.detach(), "grads": {n: whole(p.grad).clone() for n, p in model.named_parameters()}}


def tagger_under_tp(out: str) -> None:
    """Run by torchrun, 2 CPU processes: the tagger as train.strategy tp prepares it, its parameters'
    shapes on this rank, its attention modules' heads, its loss and gradients; rank 0 saves them
    with the loss and gradients of the whole model in one process."""
    from attnlab.parallel.distributed import exit_worker, is_dtensor, joined_world
    from attnlab.runs.train_config import TrainConfig
    from attnlab.train.strategy import strategy_for

    register_family(ShardedTaggerFamily)
    with joined_world() as world:
        split = strategy_for(TrainConfig(strategy="tp"), world).prepare(tagger(), torch.device("cpu"))
        local = {n: p.to_local() if is_dtensor(p) else p for n, p in split.named_parameters()}
        result = {
            "shapes": {n: tuple(p.shape) for n, p in local.items()},
            "heads": [split.get_submodule(path).n_heads for path in split.tensor_plan().heads],
            "tp": tagger_gradients(split),
        }
        if world.is_main:
            torch.save(result | {"one": tagger_gradients(tagger())}, out)
    exit_worker(0)


def test_a_family_with_a_tensor_parallel_plan_is_split_as_it_declares_under_tp(tmp_path):
    import os
    import subprocess

    from attnlab.parallel.distributed import World
    from attnlab.train.strategy import check_strategy

    from helpers import TORCHRUN, why

    with registered(ShardedTaggerFamily):
        check_strategy("tp", model_config(arch="test_tagger"), World(rank=0, size=2))
        whole_shapes = {n: tuple(p.shape) for n, p in tagger().named_parameters()}
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_plugins; "
        f"test_plugins.tagger_under_tp({str(tmp_path / 'tp.pt')!r})"
    )
    launch = [*TORCHRUN, "--standalone", "--nproc_per_node", "2", "--no-python", sys.executable, "-c", code]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}  # a crash shows its stack (helpers.why)
    done = subprocess.run(launch, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, why(done)
    result = torch.load(tmp_path / "tp.pt")
    d, heads, d_ff, hidden, V = 16, 4, 32, 32, TAGGER_VOCAB
    attention, feed_forward = "encoder.layers.0.self_attn", "encoder.layers.0.feed_forward"
    halved = {  # the plan's linears, half of each on a rank; a row split keeps its bias whole
        f"{attention}.qkv_proj.weight": (3 * d // 2, d),
        f"{attention}.qkv_proj.bias": (3 * d // 2,),
        f"{attention}.out_proj.weight": (d, d // 2),
        f"{attention}.out_proj.bias": (d,),
        f"{feed_forward}.w_1.weight": (d_ff // 2, d),
        f"{feed_forward}.w_1.bias": (d_ff // 2,),
        f"{feed_forward}.w_2.weight": (d, d_ff // 2),
        f"{feed_forward}.w_2.bias": (d,),
        "w_in.weight": (hidden // 2, d),
        "w_in.bias": (hidden // 2,),
        "w_out.weight": (V, hidden // 2),
        "w_out.bias": (V,),
    }
    layer_1 = {n.replace("layers.0", "layers.1"): shape for n, shape in halved.items() if "layers.0" in n}
    assert result["shapes"] == whole_shapes | halved | layer_1
    assert result["heads"] == [heads // 2] * 2
    torch.testing.assert_close(result["tp"]["loss"], result["one"]["loss"], atol=0, rtol=1e-5)
    for name, g in result["one"]["grads"].items():  # the reordered sums of tests/test_parallel.py's tp test
        torch.testing.assert_close(
            result["tp"]["grads"][name], g, atol=1e-6, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
        )


@pytest.mark.parametrize("strategy", ["tp", "fsdp+tp"])
def test_a_family_with_an_attention_stack_and_no_tensor_parallel_plan_is_refused_in_one_line(strategy):
    from attnlab.parallel.distributed import World
    from attnlab.train.strategy import check_strategy

    with registered(UnplannedTaggerFamily):
        cfg = model_config(arch="test_tagger_without_plan")
        with pytest.raises(
            ConfigError,
            match=rf"^train.strategy {re.escape(strategy)}: model.arch "
            r"'test_tagger_without_plan' has an attention stack but its model "
            r"\(Tagger\) declares no tensor-parallel plan \(a tensor_plan method, "
            r"nn/tensor_plan.py\)$",
        ):
            check_strategy(strategy, cfg, World(rank=0, size=2))
