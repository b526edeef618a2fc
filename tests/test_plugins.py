"""Model families and tasks as plug-ins: the registries, capabilities, and, registered from outside
the package, a bigram language model (a new family on a built-in task), a bag-of-embeddings
sentiment classifier (a new family and a new task) and a linear classifier of series (a task without
a vocabulary, which declares no tokenizer) that train through the normal command line."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Optional

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab import FAMILIES, ConfigError, build_model, model_config, register_family
from attnlab.config import at_least
from attnlab.data.corpora import read_tsv
from attnlab.data.tokenizers import PAD, Tokenizer
from attnlab.models import Capabilities, FamilyConfig, Inputs, ModelFamily
from attnlab.tasks import TASKS, Task, TaskConfig, register_task
from attnlab.train.checkpoint import load_run
from helpers import run_cli


@dataclass(frozen=True)
class BigramConfig(FamilyConfig):
    """A bigram language model: each token's embedding predicts the next token."""

    vocab_size: int
    d_model: int = 16
    pad_id: int = 0

    def check(self) -> None:
        at_least("d_model", self.d_model, 1)


class BigramLM(nn.Module):
    def __init__(self, cfg: BigramConfig) -> None:
        super().__init__()
        self.pad_id = cfg.pad_id
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.generator = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, V) logits of the next token."""
        return self.generator(self.embed(ids))


class BigramFamily(ModelFamily):
    name = "test_bigram"
    config = BigramConfig
    capabilities = Capabilities(encoder=False, decoder=True, incremental_decoding=False, attention_weights=False)

    @staticmethod
    def build(cfg: BigramConfig) -> BigramLM:
        return BigramLM(cfg)


# -- a new family and a new task: a bag-of-embeddings sentiment classifier ------------------------

@dataclass(frozen=True)
class BagConfig(FamilyConfig):
    """The mean of a text's word embeddings, then a linear map to the classes."""

    vocab_size: int
    n_classes: int
    d_model: int = 8
    pad_id: int = 0


class BagOfEmbeddings(nn.Module):
    def __init__(self, cfg: BagConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.classify = nn.Linear(cfg.d_model, cfg.n_classes)
        self.pad_id = cfg.pad_id

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
    def build(cfg: BagConfig) -> BagOfEmbeddings:
        return BagOfEmbeddings(cfg)


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
            chunk = examples[start:start + self.batch_size]
            ids = torch.full((len(chunk), max(len(i) for i, _ in chunk)), PAD)
            for row, (i, _) in enumerate(chunk):
                ids[row, :len(i)] = torch.tensor(i)
            out.append(LabelledBatch(ids, torch.tensor([label for _, label in chunk])))
        return out


class Sentiment(Task):
    name = "test_sentiment"
    config = SentimentConfig
    needs = {"encoder": True, "decoder": False}
    metrics = {"valid_loss": True, "accuracy": False}
    commands = ()
    tokenizers = ("src",)

    @classmethod
    def prepare(cls, cfg, batching, tokenizers=None, state=None):
        pairs = read_tsv(cfg.train)
        labels = sorted({label for _, label in pairs})
        if tokenizers is None:
            tokenizers = {"src": Tokenizer.train("word", [text for text, _ in pairs], cfg.vocab_size), "tgt": None}
        examples = list(zip(tokenizers["src"].encode_batch([t for t, _ in pairs]), [labels.index(l) for _, l in pairs]))
        data = LabelledData(tokenizers, {"train": examples[:-cfg.n_valid], "valid": examples[-cfg.n_valid:]},
                            batching.seed, batching.batch_size)
        data.labels = labels
        return data

    @classmethod
    def model_fields(cls, cfg, data=None):
        return {"vocab_size": cls.vocabulary(data, "src"), "n_classes": len(data.labels) if data is not None else 2,
                "pad_id": PAD}

    @classmethod
    def loss(cls, model, batch, label_smoothing, amp):
        with amp():
            logits = model(batch.ids).float()
        return (F.cross_entropy(logits, batch.labels, reduction="sum", label_smoothing=label_smoothing),
                F.cross_entropy(logits, batch.labels, reduction="sum"))

    @classmethod
    @torch.no_grad()
    def validate(cls, model, data, device, amp, n_decoded):
        model.eval()
        nll = right = 0.0
        for batch in data.eval_batches("valid"):
            batch = batch.to(device)
            logits = model(batch.ids)
            nll += F.cross_entropy(logits, batch.labels, reduction="sum").item()
            right += (logits.argmax(-1) == batch.labels).sum().item()
        n = len(data.splits["valid"])
        return {"valid_loss": nll / n, "accuracy": right / n}

    @classmethod
    def describe(cls, data):
        return f"labelled texts: train {len(data.splits['train'])}, valid {len(data.splits['valid'])}; " \
               f"labels {', '.join(data.labels)}"


# -- a task without a vocabulary: numbers in, a class out; no tokenizer anywhere ------------------

@dataclass(frozen=True)
class SeriesLinearConfig(FamilyConfig):
    """One linear map from a series' values to the class logits."""

    length: int
    n_classes: int


class SeriesLinear(nn.Module):
    def __init__(self, cfg: SeriesLinearConfig) -> None:
        super().__init__()
        self.classify = nn.Linear(cfg.length, cfg.n_classes)

    def forward(self, series: torch.Tensor) -> torch.Tensor:
        """(B, L, 1) values -> (B, n_classes) logits."""
        return self.classify(series.squeeze(-1))


class SeriesLinearFamily(ModelFamily):
    name = "test_series_linear"
    config = SeriesLinearConfig
    capabilities = Capabilities(encoder=True, decoder=False, incremental_decoding=False, attention_weights=False,
                                inputs=Inputs.SERIES)

    @staticmethod
    def build(cfg: SeriesLinearConfig) -> SeriesLinear:
        return SeriesLinear(cfg)


@dataclass(frozen=True)
class TrendConfig(TaskConfig):
    """``n`` generated series of ``length`` values, labelled 'up' where their sum is positive; the
    last ``n_valid`` are held out."""

    n: int = 120
    n_valid: int = 20
    length: int = 4
    seed: int = 0

    @property
    def in_memory(self) -> bool:
        return True


@dataclass
class SeriesBatch:
    series: torch.Tensor  # (B, L, 1)
    labels: torch.Tensor  # (B,)

    @property
    def n_targets(self) -> int:
        return len(self.labels)  # one class per series

    def to(self, device):
        return SeriesBatch(self.series.to(device), self.labels.to(device))


@dataclass
class TrendData:  # no tokenizers: a task without tokens has none
    splits: dict[str, SeriesBatch]
    batch_size: int

    def epoch_batches(self, epoch: int) -> list[SeriesBatch]:
        train = self.splits["train"]
        order = torch.randperm(len(train.labels), generator=torch.Generator().manual_seed(epoch))
        return [SeriesBatch(train.series[i], train.labels[i]) for i in order.split(self.batch_size)]

    def eval_batches(self, split: str) -> list[SeriesBatch]:
        return [self.splits[split]]


class Trend(Task):
    name = "test_trend"
    config = TrendConfig
    needs = {"inputs": Inputs.SERIES, "encoder": True}
    metrics = {"valid_loss": True}
    commands = ()
    counts = "examples"

    @classmethod
    def prepare(cls, cfg, batching, tokenizers=None, state=None):
        series = torch.randn(cfg.n, cfg.length, 1, generator=torch.Generator().manual_seed(cfg.seed))
        labels = (series.sum((1, 2)) > 0).long()  # 0 down, 1 up
        return TrendData({"train": SeriesBatch(series[:-cfg.n_valid], labels[:-cfg.n_valid]),
                          "valid": SeriesBatch(series[-cfg.n_valid:], labels[-cfg.n_valid:])}, batching.batch_size)

    @classmethod
    def model_fields(cls, cfg, data=None):
        return {"length": cfg.length, "n_classes": 2}

    @classmethod
    def loss(cls, model, batch, label_smoothing, amp):
        with amp():
            logits = model(batch.series).float()
        nll = F.cross_entropy(logits, batch.labels, reduction="sum")
        return nll, nll

    @classmethod
    @torch.no_grad()
    def validate(cls, model, data, device, amp, n_decoded):
        model.eval()
        batch = data.eval_batches("valid")[0].to(device)
        return {"valid_loss": F.cross_entropy(model(batch.series), batch.labels).item()}

    @classmethod
    def describe(cls, data):
        return f"series: train {len(data.splits['train'].labels)}, valid {len(data.splits['valid'].labels)}"


@pytest.fixture(autouse=True, scope="module")
def plugins_registered():
    """Registered for this module's tests only: other tests list the families and tasks (in error
    messages)."""
    register_family(BigramFamily)
    register_family(BagFamily)
    register_task(Sentiment)
    register_family(SeriesLinearFamily)
    register_task(Trend)
    yield
    del FAMILIES[BigramFamily.name], FAMILIES[BagFamily.name], TASKS[Sentiment.name]
    del FAMILIES[SeriesLinearFamily.name], TASKS[Trend.name]


def test_the_built_in_families_and_their_capabilities():
    assert list(FAMILIES)[:4] == ["encoder_decoder", "decoder_lm", "encoder_only", "rnn"]
    can = {name: FAMILIES[name].capabilities for name in ("encoder_decoder", "decoder_lm", "encoder_only", "rnn")}
    assert [(c.encoder, c.decoder, c.incremental_decoding, c.attention_weights) for c in can.values()] == [
        (True, True, True, True), (False, True, True, True), (True, False, False, True), (True, True, True, False)]
    assert model_config(arch="rnn", vocab_size=9).capabilities is can["rnn"]


def test_a_family_owns_its_fields_and_round_trips():
    cfg = model_config(arch="test_bigram", vocab_size=11, d_model=4)
    assert cfg.to_dict() == {"arch": "test_bigram", "vocab_size": 11, "d_model": 4, "pad_id": 0}
    assert model_config(cfg.to_dict()) == cfg
    assert sum(p.numel() for p in build_model(cfg).parameters()) == 11 * 4 + 4 * 11 + 11
    with pytest.raises(ConfigError, match=r"model.arch 'test_bigram' has no field 'n_heads'; its fields: "
                                          r"vocab_size, d_model, pad_id"):
        model_config(arch="test_bigram", vocab_size=11, n_heads=2)


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
data: {{format: text, train: {tmp_path}/text.txt, tokenizer: char, block_size: 16}}
train: {{max_steps: 30, batch_size: 8, lr_schedule: constant, lr: 0.05, warmup_steps: 1, eval_every: 30,
        log_every: 1, progress: false}}
""")
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "model: test_bigram, 136 parameters" in done.stdout  # V = 4 specials + a, b, space, newline: 2 x 8 x 8 + 8
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if json.loads(line)["split"] == "train"]
    assert len(losses) == 30 and losses[-1] < 0.5 * losses[0]  # from ln 8 towards what a bigram can know of "abab abab"
    model, _, cfg = load_run(tmp_path / "run")
    assert isinstance(model, BigramLM) and cfg.arch == "test_bigram"
    refused = run_cli("translate", str(tmp_path / "run"), stdin="a b\n")  # the task does not translate
    assert refused.returncode == 2 and refused.stderr == (
        f"error: {tmp_path / 'run'} is a run of data.task 'language_model'; `attnlab translate` needs data.task "
        f"'translation' or 'masked_translation' (this run's commands: generate, score, inspect, prune)\n")
    refused = run_cli("generate", str(tmp_path / "run"), "--seed", "1")  # the task generates; the family has no cache
    assert refused.returncode == 2 and refused.stderr == (
        f"error: {tmp_path / 'run'} holds a model of arch 'test_bigram'; `attnlab generate` needs 'decoder_lm' or 'transformer_xl'\n")


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
    assert isinstance(model, BagOfEmbeddings) and cfg.n_classes == 2 and tokenizers["tgt"] is None
    ids = torch.tensor([tokenizers["src"].encode("the plot was good"), tokenizers["src"].encode("the plot was bad")])
    assert model(ids).argmax(-1).tolist() == [1, 0]  # pos, neg (labels sorted: neg = 0)
    for command, needs in (("translate", "'translation' or 'masked_translation'"),
                           ("inspect", "'translation' or 'language_model' or 'classification' or 'masked_lm' or "
                                       "'image_classification' or 'captioning' or 'visual_qa' or 'encoder' or 'image_encoder'")):
        refused = run_cli(command, str(tmp_path / "run"), *(["--split", "valid"] if command == "inspect" else []),
                          stdin="good\n")
        assert refused.returncode == 2 and refused.stderr == (
            f"error: {tmp_path / 'run'} is a run of data.task 'test_sentiment'; `attnlab {command}` needs data.task "
            f"{needs} (this run's commands: )\n")


def test_a_task_refuses_what_it_cannot_train_and_fields_it_does_not_have(tmp_path):
    train = sentiment_file(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(SENTIMENT.format(train=train).replace("test_bag", "rnn"))
    done = run_cli("train", str(config), "--out", str(tmp_path / "r"))
    assert done.returncode == 3 and done.stderr == (
        f"error: {config}: model.arch must be 'encoder_only' or 'test_bag' for data.task 'test_sentiment'; got 'rnn'\n")
    done = run_cli("train", str(config), "--out", str(tmp_path / "r"), "--set", "data.block_size=4")
    assert done.returncode == 3 and "--set 'data.block_size=4': unknown field 'block_size' in section 'data'" in done.stderr
    config.write_text(SENTIMENT.format(train=train).replace("n_valid: 20", "n_vaild: 20"))
    done = run_cli("train", str(config), "--out", str(tmp_path / "r"))
    assert done.returncode == 3 and done.stderr == (
        f"error: {config}: data.task 'test_sentiment' has no field 'n_vaild' (did you mean 'n_valid'?); its fields: "
        f"train, n_valid, vocab_size\n")
    assert not (tmp_path / "r").exists()


def test_a_task_without_a_vocabulary_declares_no_tokenizer_and_counts_examples(tmp_path):
    assert "tokenizers" not in vars(Trend) and Trend.tokenizers == ()  # the default: no tokenizer
    config = tmp_path / "trend.yaml"
    config.write_text("""\
model: {arch: test_series_linear}
data: {task: test_trend}
train: {max_steps: 20, batch_size: 20, lr_schedule: constant, lr: 0.1, warmup_steps: 1, eval_every: 10,
        log_every: 5, progress: false}
""")
    info = run_cli("info", str(config), "--json")  # no --vocab-size: the task has no vocabulary
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["params_total"] == 4 * 2 + 2  # length 4 -> 2 classes
    info = run_cli("info", str(config))  # a family with no stack of layers: its name alone
    assert info.returncode == 0 and info.stdout.startswith(f"{config}: test_series_linear\nparameters ")
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "run").glob("tokenizer*")) == []
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["train_examples"] == 20 * 20 and "train_tokens" not in summary  # 20 updates of 20 series
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "examples_per_s" in r] == [5, 10, 15, 20]
    valid = [r["valid_loss"] for r in records if r["split"] == "valid"]
    assert len(valid) == 2 and valid[-1] < 0.5 * math.log(2)  # a sum's sign: one linear map separates it
    model, tokenizers, cfg = load_run(tmp_path / "run")
    assert tokenizers == {} and isinstance(model, SeriesLinear) and (cfg.length, cfg.n_classes) == (4, 2)


def test_a_task_whose_data_sets_a_vocabulary_size_must_declare_its_tokenizer(tmp_path):
    """Registering a task with no tokenizer and the default model_fields (a tokenizer's vocabulary) is
    refused; a model_fields that reads the vocabulary of a tokenizer the task does not declare (it
    would not be saved with a run) is refused where the fields are first planned, before any run."""
    class Forgetful(Task):
        name = "test_forgetful"
        needs = {"encoder": True}

    with pytest.raises(TypeError, match=r"task 'test_forgetful' declares no tokenizer, so its data sets no "
                                        r"vocabulary: define its model_fields\(cfg, data=None\)"):
        register_task(Forgetful)
    assert "test_forgetful" not in TASKS

    class Undeclared(Sentiment):
        name = "test_undeclared"
        tokenizers = ()

    register_task(Undeclared)
    try:
        config = tmp_path / "c.yaml"
        config.write_text(SENTIMENT.format(train=sentiment_file(tmp_path)).replace("test_sentiment", "test_undeclared"))
        with pytest.raises(TypeError, match=r"task 'test_undeclared' sets a vocabulary size from its 'src' tokenizer: "
                                            r"declare the roles of the tokenizers it saves"):
            run_cli("train", str(config), "--out", str(tmp_path / "run"))
        assert not (tmp_path / "run").exists()
    finally:
        del TASKS[Undeclared.name]
