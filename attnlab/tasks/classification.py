"""Classification: a text, or a pair of texts, to one of a set of labels, read from TSV files,
trained with the cross-entropy over examples, validated by accuracy and macro-F1, used by
`predict`. BERT's input: <bos> (as [CLS]) text_a <eos> (as [SEP]) [text_b <eos>], with segment
ids 0 for the first part and 1 for the second.

:class:`ClassifierTask`, what every classification task shares (the image classifier too: the
loss, the metrics, and `evaluate`'s report on a split or a file), is tasks/classifier_task.py's."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from attnlab.config import at_least, flattened
from attnlab.data.batching import pad_sequences
from attnlab.data.corpora import Labelled, read_labelled
from attnlab.data.tokenizers import BOS, EOS, PAD, Tokenizer
from attnlab.errors import ConfigError, DataError, UsageError
from attnlab.models.shape import DataShape
from attnlab.nn.interfaces import Classifier
from attnlab.tasks.abilities import Piped, Prediction, PredictsLabels, RunState
from attnlab.tasks.batching import Batching, BucketedData, Tokenizers, hold_out_valid
from attnlab.tasks.classifier_task import NO_LABEL, ClassifierTask, ExampleBatch, evaluation_report
from attnlab.tasks.parts import SPLIT_FILES, Files, Splits, Text, Truncation
from attnlab.tasks.task import TaskConfig, register_task

if TYPE_CHECKING:
    from attnlab.models.encoder_only import EncoderOnlyConfig


@dataclass(frozen=True)
class ClassificationConfig(TaskConfig):
    """``text TAB label`` or ``text_a TAB text_b TAB label`` files (``header``: the first line
    names the columns). Labels are any strings: the training file's, sorted, are the classes.
    Without a ``valid`` file the last ``splits.n_valid`` training lines are held out. Inputs longer than
    ``max_len`` tokens (with <bos> and <eos>; Truncation, written flat) are cut, the longer text of a
    pair first."""

    files: Files = flattened(Files(), SPLIT_FILES)
    header: bool = False
    text: Text = Text()
    truncation: Truncation = flattened(Truncation(max_len=128))
    splits: Splits = Splits(n_valid=500)
    splits_read = ("n_valid",)

    def check(self) -> None:
        at_least("max_len", self.truncation.max_len, 4)  # a pair: <bos> <eos> <eos> and a token
        self.splits.read_by(self.chosen_name(), self.splits_read)
        self.splits.given(*self.splits_read)

    def check_trainable(self) -> None:
        if self.files.train is None:
            raise ConfigError("data.task 'classification' needs 'train' (a TSV file)")

    @property
    def longest_sequence(self) -> int:
        return self.truncation.max_len


@dataclass
class ClassBatch(ExampleBatch):
    """ids, segments: (B, T), PAD-padded; labels: (B,) class ids."""

    ids: Tensor
    segments: Tensor
    labels: Tensor

    def logits(self, model: nn.Module) -> Tensor:
        """(B, n_classes): the model on these inputs."""
        return cast(Classifier, model).classify(self.ids, self.segments)  # the task's model: a classifier


@dataclass
class Encoded:
    """One example as model input: token ids with <bos>/<eos>, segment ids, the label's id."""

    ids: list[int]
    segments: list[int]
    label: int


@dataclass(kw_only=True)
class ClassificationData(BucketedData[Encoded, ClassBatch]):
    """Encoded examples per split, the labels (class id -> label), and how many training inputs
    were cut to max_len."""

    splits: dict[str, list[Encoded]]
    labels: list[str]
    truncated: int = 0

    def length(self, example: Encoded) -> int:
        return len(example.ids)

    def collate(self, examples: list[Encoded], seed: int) -> ClassBatch:
        return collate(examples)


def collate(examples: list[Encoded]) -> ClassBatch:
    return ClassBatch(
        pad_sequences([e.ids for e in examples]),
        pad_sequences([e.segments for e in examples]),
        torch.tensor([e.label for e in examples]),
    )


def encode_inputs(
    tokenizer: Tokenizer, texts_a: list[str], texts_b: list[str | None], max_len: int
) -> tuple[list[tuple[list[int], list[int]]], int]:
    """(ids, segments) of each input, cut to ``max_len`` (the longer text first), and how many were cut."""
    a_ids = tokenizer.encode_batch(texts_a)
    b_ids = tokenizer.encode_batch([b or "" for b in texts_b])
    out, cut = [], 0
    for a, b, has_b in zip(a_ids, b_ids, [b is not None for b in texts_b]):
        room = max_len - 2 - has_b  # <bos> a <eos> [b <eos>]
        if len(a) + len(b) > room:
            cut += 1
            while len(a) + len(b) > room:
                (a if len(a) >= len(b) else b).pop()
        ids = [BOS, *a, EOS] + ([*b, EOS] if has_b else [])
        out.append((ids, [0] * (len(a) + 2) + [1] * (len(ids) - len(a) - 2)))
    return out, cut


@register_task
class Classification(PredictsLabels, ClassifierTask[ClassificationData, ClassBatch]):
    """A label for each text, read by an encoder (data.task: classification), scored by
    loss, accuracy and macro F1."""

    name = "classification"
    config = ClassificationConfig
    needs = {"encoder": True, "decoder": False}
    commands = ("predict", "evaluate", "inspect", "prune")
    tokenizers = ("src",)
    untrained = ("mlm_head.",)
    pipeline_head = "classify"
    cfg: ClassificationConfig

    def piped(self, batch: ClassBatch) -> Piped:
        return Piped((batch.ids, batch.segments), batch.labels, NO_LABEL)

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, typing.Any] | None = None
    ) -> ClassificationData:
        cfg = self.cfg
        files = dict(cfg.files.given())
        read = hold_out_valid(
            {name: read_labelled(path, self.cfg.header) for name, path in files.items()},
            self.cfg.splits.n_valid or 0,  # given: ClassificationConfig.check
            self.cfg.files.train,
            "examples",
            "splits.n_valid",
        )
        labels = state["labels"] if state else sorted({e.label for e in read["train"]})
        if len(labels) < 2:
            raise DataError(f"{self.cfg.files.train}: one label ('{labels[0]}'); a classifier needs at least two")
        if tokenizers is None:
            texts = [t for e in read["train"] for t in (e.text_a, e.text_b) if t is not None]
            tokenizers = {"src": self.cfg.text.fitted(texts), "tgt": None}
        splits, truncated = {}, 0
        for name, examples in read.items():
            where = cast(str, files.get(name, self.cfg.files.train))  # a held-out valid: the train file's
            ids = label_ids(examples, labels, where)
            inputs, cut = encode_inputs(
                cast(Tokenizer, tokenizers["src"]),
                [e.text_a for e in examples],
                [e.text_b for e in examples],
                self.cfg.truncation.max_len,
            )
            splits[name] = [Encoded(i, s, label) for (i, s), label in zip(inputs, ids)]
            truncated += cut if name == "train" else 0
        return ClassificationData(
            tokenizers=tokenizers, splits=splits, labels=labels, truncated=truncated, **batching.bucketing()
        )

    def saved_state(self, data: ClassificationData) -> dict[str, typing.Any]:
        """The labels, in class-id order, and whether the inputs are sentence pairs."""
        return {"labels": data.labels, "pairs": any(1 in e.segments for e in data.splits["train"])}

    def data_shape(self, data: ClassificationData | None = None) -> DataShape:
        """Two classes before the data is read. Sentence pairs have 2 segments; single texts leave the
        segment table to the model section (0 by default; a pre-trained model keeps its table, whose
        first row it adds everywhere)."""
        pairs = data is not None and any(1 in e.segments for e in data.splits["train"])
        return DataShape(
            vocab_size=self.vocabulary(data, "src"),
            n_classes=len(data.labels) if data is not None else 2,
            pad_id=PAD,
            segments=2 if pairs else None,
        )

    def analysis_pass(self, model: nn.Module, batch: ClassBatch) -> dict[str, Tensor]:
        cast(Classifier, model).classify(batch.ids, batch.segments)  # the task's model: a classifier
        return {"encoder": batch.ids != PAD}

    def evaluate_file(
        self, model: nn.Module, tokenizers: Tokenizers, state: dict[str, typing.Any], path: str, split: str | None
    ) -> dict[str, typing.Any]:
        """Loss, accuracy, macro-F1 and the confusion matrix on a labelled file, read and encoded as
        the run's training data was (``self.cfg``, ``tokenizers`` and ``state``: the run's)."""
        self.refuse_split(split)
        examples = read_labelled(path, self.cfg.header)
        ids = label_ids(examples, state["labels"], path)
        inputs, _ = encode_inputs(
            cast(Tokenizer, tokenizers["src"]),
            [e.text_a for e in examples],
            [e.text_b for e in examples],
            self.cfg.truncation.max_len,
        )
        encoded = [Encoded(i, s, label) for (i, s), label in zip(inputs, ids)]
        test = ClassificationData(tokenizers=tokenizers, splits={"test": encoded}, labels=state["labels"])
        return evaluation_report(model, test.eval_batches("test"), state["labels"])

    def predict(
        self,
        model: nn.Module,
        run: RunState,
        inputs: list[str],
        input_file: str | None,
        batch_size: int,
        **options: str,
    ) -> list[Prediction]:
        """One text per line of ``input_file`` (or stdin), or ``text_a TAB text_b``; a blank line
        gives no prediction."""
        from attnlab.data.corpora import read_input_lines

        if inputs:
            raise UsageError("a text classifier reads one text per line from --input FILE or stdin, not arguments")
        lines = read_input_lines(input_file, "classify")
        state = run.read_task_state()
        # runs of before 'pairs': pairs had segments
        family = cast("EncoderOnlyConfig", run.read_config()[0])  # the model section of a text classifier's run
        pairs = state.get("pairs", family.segment_rows(run.read_shape()) > 0)
        probabilities = classify(
            model,
            cast(Tokenizer, run.read_tokenizers()["src"]),
            lines,
            self.cfg.truncation.max_len,
            pairs,
            batch_size,
            input_file or "<stdin>",
        )
        return [(None, p if line.strip() else None) for line, p in zip(lines, probabilities)]

    def describe(self, data: ClassificationData) -> str:
        sizes = ", ".join(f"{name} {len(e):,}" for name, e in data.splits.items())
        cut = f"; {data.truncated} training inputs cut to max_len" if data.truncated else ""
        return (
            f"labelled examples: {sizes}; labels {', '.join(data.labels)}; vocabulary "
            f"{cast(Tokenizer, data.tokenizers['src']).vocab_size}{cut}"
        )


def label_ids(examples: list[Labelled], labels: list[str], path: str) -> list[int]:
    """Each example's class id; a label the training data did not have is refused with its line."""
    index = {label: i for i, label in enumerate(labels)}
    for e in examples:
        if e.label not in index:
            raise DataError(
                f"{path}:{e.line}: label '{e.label}' is not one the model was trained on ({', '.join(labels)})"
            )
    return [index[e.label] for e in examples]


@torch.no_grad()
def classify(
    model: nn.Module,
    tokenizer: Tokenizer,
    lines: list[str],
    max_len: int,
    pairs: bool,
    batch_size: int = 64,
    name: str = "<input>",
) -> list[list[float]]:
    """The class probabilities of each input line, ``text`` or (``pairs``) ``text_a TAB text_b``,
    encoded as in training; in the order given. Errors name the line of ``name``."""
    model.eval()
    split = [line.split("\t") for line in lines]
    for n, fields in enumerate(split, start=1):
        if len(fields) > (2 if pairs else 1):
            expected = "text or text_a TAB text_b" if pairs else "one text (the model was trained on single texts)"
            raise DataError(f"{name}:{n}: expected {expected}, found {len(fields)} tab-separated fields")
    inputs, _ = encode_inputs(tokenizer, [f[0] for f in split], [f[1] if len(f) == 2 else None for f in split], max_len)
    device = next(model.parameters()).device
    probabilities: list[list[float]] = []
    for start in range(0, len(inputs), batch_size):
        chunk = [Encoded(ids, segments, 0) for ids, segments in inputs[start : start + batch_size]]
        batch = collate(chunk).to(device)
        probabilities += cast(Classifier, model).classify(batch.ids, batch.segments).float().softmax(-1).tolist()
    return probabilities
