"""Visual question answering: an image and a question about it to one answer from a fixed set (a
classification over the answers seen in training). The data is the built-in ``scenes``
(data/scenes.py): each scene's question/answer pairs ("how many circles?" -> "2", "what colour is
the square?" -> "blue", "what shape is the red object?" -> "circle"), in the four splits of
tasks/scene_splits.py: an in-distribution test and a compositional one, whose every scene holds a
held-out colour-shape combination.

A question is read as BERT reads a text: <bos> (as [CLS]) the words <eos> (as [SEP]), word-tokenised;
an image is standardised per channel with the training split's statistics (task_state.json, with
the answers and the images' shape). Trained with the cross-entropy over questions, validated by
accuracy and macro-F1 (tasks/classifier_task.py ClassifierTask); `attnlab evaluate --split NAME`
(or ``--data FILE``: ``image TAB question TAB answer`` lines) adds the accuracy of each kind of
question; `attnlab ask RUN image.png --question "..."` answers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.config import at_least
from attnlab.data.batching import pad_sequences
from attnlab.data.corpora import read_lines
from attnlab.data.images import Standardise, as_tensor, colour_of, read_image
from attnlab.data.scenes import Scene
from attnlab.data.tokenizers import BOS, EOS, PAD, UNK, Tokenizer
from attnlab.errors import ConfigError, DataError, UsageError
from attnlab.models.family import Inputs
from attnlab.models.shape import DataShape
from attnlab.nn.interfaces import Classifier
from attnlab.tasks.abilities import RunState
from attnlab.tasks.batching import Batching, Tokenizers
from attnlab.tasks.captions import ImageRows, read_input_images
from attnlab.tasks.classifier_task import ClassifierTask, ExampleBatch, evaluation_report, scores_of
from attnlab.tasks.image_classification import class_ids, class_names
from attnlab.tasks.parts import ImageSource, Splits, Text
from attnlab.tasks.scene_splits import SCENE_SPLITS, SCENE_SPLITS_READ, Scenes
from attnlab.tasks.task import TaskConfig, register_task

if TYPE_CHECKING:
    from attnlab.nn.single_stream import SingleStreamTransformer

BUILT_IN = ("scenes",)
KINDS = {"how many": "count", "what colour": "colour", "what shape": "shape"}  # a question's first two words


def kind_of(question: str) -> str:
    """'count', 'colour' or 'shape' (the scenes' three kinds of question), else 'other'."""
    return KINDS.get(" ".join(question.split()[:2]), "other")


@dataclass(frozen=True)
class VisualQAConfig(TaskConfig):
    """``images: {dataset: scenes}`` (the only one; its images are drawn, so ``images`` takes no
    colour or resize), drawn as ``scenes`` says with ``splits``' sizes and seed
    (tasks/scene_splits.py); the
    questions' ``tokenizer`` (``word_nopunct`` by default: punctuation dropped, as VQA's own preprocessing
    drops it, so a question asked with or without its question mark is the same words) and ``vocab_size``; ``max_question_len``,
    the most tokens of a question (a longer one is refused)."""

    images: ImageSource = ImageSource(dataset="scenes")
    scenes: Scenes = Scenes()
    splits: Splits = SCENE_SPLITS
    text: Text = Text(tokenizer="word_nopunct")
    max_question_len: int = 16

    splits_read = SCENE_SPLITS_READ

    def check(self) -> None:
        self.splits.read_by(self.chosen_name(), self.splits_read)
        if self.images.dataset is None:
            raise ConfigError(f"images.dataset: visual_qa reads the built-in {', '.join(BUILT_IN)} only (got null)")
        self.images.built_in(BUILT_IN)
        if self.images.colour != "rgb":
            raise ConfigError(f"images.colour: the scenes are drawn in rgb (got '{self.images.colour}')")
        self.scenes.check_drawn(self.splits)
        at_least("max_question_len", self.max_question_len, 1)

    @property
    def longest_sequence(self) -> int:
        return self.max_question_len + 2  # <bos> question <eos>: the text positions

    @property
    def in_memory(self) -> bool:
        return True


# -- batches ------------------------------------------------------------------------------------------


@dataclass
class QABatch(ExampleBatch):
    """images: (B, C, H, W), standardised; ids: (B, T) <bos> question <eos>, PAD-padded; labels: (B,)."""

    images: Tensor
    ids: Tensor
    labels: Tensor

    def logits(self, model: nn.Module) -> Tensor:
        """(B, n_answers)."""
        return cast(Classifier, model).classify(self.images, self.ids)  # the task's model: a classifier


@dataclass
class QASplit:
    """One split: the scenes' images (S, C, H, W) as drawn (0-255); each question's scene (M,), text,
    ids (<bos> ... <eos>) and answer id (M,)."""

    images: Tensor
    scene: Tensor
    questions: list[str]
    ids: list[list[int]]
    labels: Tensor

    def __len__(self) -> int:
        return len(self.questions)


def question_ids(tokenizer: Tokenizer, questions: list[str], longest: int, where: str) -> list[list[int]]:
    """<bos> question <eos> for each; an empty question, or one of more than ``longest`` tokens, is refused."""
    ids = tokenizer.encode_batch(questions)
    for n, row in enumerate(ids, start=1):
        if not row or len(row) > longest:
            raise DataError(
                f"{where}: question {n} has {len(row)} tokens; data.max_question_len is {longest} (and a "
                f"question needs at least one)"
            )
    return [[BOS, *row, EOS] for row in ids]


def qa_split(drawn: list[Scene], tokenizer: Tokenizer, answers: list[str], longest: int, where: str) -> QASplit:
    """Every question of every scene, in order."""
    pairs = [(i, q, a) for i, scene in enumerate(drawn) for q, a in scene.questions]
    images = as_tensor(np.stack([s.pixels for s in drawn]).astype(np.float32))  # (S, C, H, W)
    questions = [q for _, q, _ in pairs]
    return QASplit(
        images,
        torch.tensor([i for i, _, _ in pairs]),
        questions,
        question_ids(tokenizer, questions, longest, where),
        class_ids([a for _, _, a in pairs], answers, where),
    )


@dataclass(kw_only=True)
class QAData(ImageRows):
    """The splits, the tokenizers ({'src': questions, 'tgt': None}), the answers (class id -> answer),
    the standardisation and how batches are made: an epoch's order drawn from (seed, epoch) alone,
    so a resumed run goes on exactly."""

    splits: dict[str, QASplit]
    tokenizers: Tokenizers
    labels: list[str]
    standardise: Standardise
    batch_size: int
    seed: int = 0
    _eval: dict[str, list[QABatch]] = field(default_factory=dict, repr=False)

    def batches(self, split: QASplit, rows: list[Tensor]) -> list[QABatch]:
        return [
            QABatch(
                self.standardise(split.images[split.scene[r]]),
                pad_sequences([split.ids[i] for i in r.tolist()]),
                split.labels[r],
            )
            for r in rows
        ]


@torch.no_grad()
def answer(model: nn.Module, tokenizer: Tokenizer, images: Tensor, question: str, longest: int) -> Tensor:
    """(N, C, H, W) standardised images, one question about each -> (N, n_answers) probabilities."""
    ids = question_ids(tokenizer, [question], longest, "--question")[0]
    if UNK in ids:
        print(
            f"note: --question: {ids.count(UNK)} word(s) the model never saw in a question, read as <unk>",
            file=sys.stderr,
        )
    model.eval()
    device = next(model.parameters()).device
    batch = torch.tensor([ids] * len(images), device=device)
    return cast(Classifier, model).classify(images.to(device), batch).float().softmax(-1).cpu()


@register_task
class VisualQA(ClassifierTask[QAData, QABatch]):
    """An answer chosen for a question about an image, both read as one sequence (data.task: visual_qa)."""

    name = "visual_qa"
    config = VisualQAConfig
    needs = {"inputs": Inputs.IMAGE_TEXT, "encoder": True}  # one sequence of both, classified
    commands = ("ask", "evaluate", "inspect")
    tokenizers = ("src",)
    cfg: VisualQAConfig

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, Any] | None = None
    ) -> QAData:
        drawn = self.cfg.scenes.drawn(self.cfg.splits)
        if tokenizers is None:
            questions = [q for scene in drawn["train"] for q, _ in scene.questions]
            tokenizers = {"src": self.cfg.text.fitted(questions), "tgt": None}
        answers = state["labels"] if state else class_names([a for scene in drawn["train"] for _, a in scene.questions])
        splits = {
            name: qa_split(
                scenes, cast(Tokenizer, tokenizers["src"]), answers, self.cfg.max_question_len, f"scenes {name}"
            )
            for name, scenes in drawn.items()
        }
        pixels = splits["train"].images.permute(0, 2, 3, 1).numpy()  # (S, H, W, C)
        standardise = Standardise(state["mean"], state["std"]) if state else Standardise.fitted(pixels)
        return QAData(
            splits=splits,
            tokenizers=tokenizers,
            labels=answers,
            standardise=standardise,
            batch_size=batching.batch_size,
            seed=batching.seed,
        )

    def saved_state(self, data: QAData) -> dict[str, Any]:
        """The answers in class-id order, the images' (H, W, C) and the training split's pixel statistics."""
        channels, height, width = data.image_shape
        return {
            "labels": data.labels,
            "shape": [height, width, channels],
            "mean": data.standardise.mean,
            "std": data.standardise.std,
        }

    def data_shape(self, data: QAData | None = None) -> DataShape:
        """Before the scenes are drawn: RGB images of data.scenes.image_size, two answers."""
        size = self.cfg.scenes.image_size
        channels, height, width = data.image_shape if data is not None else (3, size, size)
        return DataShape(
            image_height=height,
            image_width=width,
            channels=channels,
            vocab_size=self.vocabulary(data, "src"),
            n_classes=len(data.labels) if data is not None else 2,
            pad_id=PAD,
        )

    def analysis_pass(self, model: nn.Module, batch: QABatch) -> dict[str, Tensor]:
        single = cast("SingleStreamTransformer", model)  # the task's model
        states, valid = single.encode(batch.images, batch.ids)
        single.classifier(states, valid)
        return {"encoder": valid}

    def evaluate_split(self, model: nn.Module, data: QAData, split: str) -> dict[str, Any]:
        """Every classifier's record (ClassifierTask), and the accuracy of each kind of question."""
        record = evaluation_report(model, data.eval_batches(split), data.labels)
        part, device = data.splits[split], next(model.parameters()).device
        kinds = [kind_of(q) for q in part.questions]
        record["by_kind"] = {}
        for kind in dict.fromkeys(kinds):
            rows = torch.tensor([i for i, k in enumerate(kinds) if k == kind])
            scores = scores_of(
                model, data.batches(part, list(torch.split(rows, data.batch_size))), len(data.labels), device
            )[0]
            record["by_kind"][kind] = {"accuracy": scores["accuracy"], "questions": len(rows)}
        return record

    def evaluate_file(
        self, model: nn.Module, tokenizers: Tokenizers, state: dict[str, Any], path: str, split: str | None
    ) -> dict[str, Any]:
        """:meth:`evaluate_split`'s record on a questions file (:func:`read_questions_file`), each
        image read and standardised as the run's training images were (resized to their size)."""
        self.refuse_split(split)
        shape = tuple(state["shape"])  # (H, W, C)
        rows = read_questions_file(path, state["labels"])
        pixels = np.stack([read_image(image, colour_of(shape), shape[:2]) for image, _, _ in rows])
        questions = [question for _, question, _ in rows]
        part = QASplit(
            as_tensor(pixels),
            torch.arange(len(rows)),
            questions,
            question_ids(cast(Tokenizer, tokenizers["src"]), questions, self.cfg.max_question_len, path),
            torch.tensor([state["labels"].index(a) for _, _, a in rows]),
        )
        data = QAData(
            splits={"file": part},
            tokenizers=tokenizers,
            labels=state["labels"],
            standardise=Standardise(state["mean"], state["std"]),
            batch_size=64,
        )
        return self.evaluate_split(model, data, "file")

    def report(self, result: dict[str, Any], source: str) -> list[str]:
        kinds = "   ".join(f"{kind} {r['accuracy']:.2%} ({r['questions']})" for kind, r in result["by_kind"].items())
        first, *confusion = super().report(result, source)
        return [first, f"accuracy by kind of question: {kinds}", *confusion]

    def describe(self, data: QAData) -> str:
        sizes = ", ".join(
            f"{name} {len(split):,} ({len(split.images):,} scenes)" for name, split in data.splits.items()
        )
        channels, height, width = data.image_shape
        return (
            f"questions on images {width}x{height}x{channels}: {sizes}; {len(data.labels)} answers "
            f"{', '.join(data.labels)}; vocabulary {cast(Tokenizer, data.tokenizers['src']).vocab_size}"
        )


def ask(model: nn.Module, run: RunState, paths: list[str], question: str) -> list[list[float]]:
    """`attnlab ask`: each image file, read as the run's training images, with ``question`` -> its
    answer probabilities (in the order of the run's answers)."""
    if not question.strip():
        raise UsageError('--question is empty; ask something, e.g. --question "how many circles?"')
    images = read_input_images(paths, run)  # one that does not decode: one line
    _, cfg, _ = run.read_config()
    src = cast(Tokenizer, run.read_tokenizers()["src"])  # the task's own role: never None
    return answer(model, src, images, question, cast(VisualQAConfig, cfg).max_question_len).tolist()  # the run's


def read_questions_file(path: str, answers: list[str]) -> list[tuple[Path, str, str]]:
    """``image TAB question TAB answer`` lines -> (image path, question, answer), the image named
    relative to the file's folder; a line of other fields, naming a missing image, or with an answer
    the model was not trained on is refused as FILE:LINE."""
    rows = []
    for n, line in enumerate(read_lines(path), start=1):
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) != 3 or not all(fields):
            raise DataError(
                f"{path}:{n}: expected 'image TAB question TAB answer', found {len(fields)} field(s)"
                f"{'' if len(fields) != 3 else ', one empty'}"
            )
        image = Path(path).parent / fields[0]
        if not image.is_file():
            raise DataError(f"{path}:{n}: no image '{fields[0]}' in {image.parent}")
        if fields[2] not in answers:
            raise DataError(
                f"{path}:{n}: answer '{fields[2]}' is not one the model was trained on ({', '.join(answers)})"
            )
        rows.append((image, fields[1], fields[2]))
    return rows
