"""What every classification task shares (text, image, audio, node and visual question
classification): :class:`ClassifierTask`, the cross-entropy over examples, accuracy and macro-F1, and
`evaluate`'s report on a split or a file (scores_of, evaluation_report); the batch a classifier reads
(ExampleBatch, Classified) and its data (LabelledData)."""

from __future__ import annotations

import contextlib
import typing

import torch
from torch import Tensor, nn

from attnlab.data.batching import moved
from attnlab.eval.metrics import classification_scores, confusion_matrix, confusion_table
from attnlab.nn.losses import label_smoothed_nll
from attnlab.tasks.task import Amp, Task

NO_LABEL = -1  # no example has it: the loss ignores nothing (class 0 is a class, not padding)


class ExampleBatch:
    """What a batch of examples (a dataclass of tensors) shares: it moves to a device tensor by
    tensor, and a classifier's (with ``labels``, (n,) class ids) sums its loss over its n examples
    (a forecaster's batch counts its forecast values instead)."""

    if typing.TYPE_CHECKING:  # to mypy, read-only: a node classifier's batch (GraphBatch) computes it

        @property
        def labels(self) -> Tensor: ...

    else:
        labels: Tensor  # a classifier's batch declares it as a field (its dataclass's); this one is no dataclass

    @property
    def n_targets(self) -> int:
        return len(self.labels)

    def to(self, device: torch.device | str) -> typing.Self:
        return moved(self, device)


class Classified(typing.Protocol):
    """A classifier's batch: ``labels`` (B,) class ids and the model's ``logits`` (B, n_classes)."""

    @property
    def labels(self) -> Tensor: ...

    def logits(self, model: nn.Module) -> Tensor: ...

    def to(self, device: torch.device | str) -> Classified: ...


@torch.no_grad()
def scores_of(
    model: nn.Module,
    batches: typing.Iterable[Classified],
    n_classes: int,
    device: torch.device,
    amp: Amp = contextlib.nullcontext,
) -> tuple[dict[str, float], list[int], list[int]]:
    """Loss, accuracy and macro-F1 over ``batches`` (each with ``labels`` and ``logits(model)``); the
    predicted and the true class of each example, in the order of the batches."""
    model.eval()
    nll, predicted, gold = 0.0, [], []
    for batch in batches:
        batch = batch.to(device)
        with amp():
            logits = batch.logits(model).float()
        nll += label_smoothed_nll(logits, batch.labels, 0.0, NO_LABEL)[1].item()
        predicted += logits.argmax(-1).tolist()
        gold += batch.labels.tolist()
    scores = {"valid_loss": nll / len(gold), **classification_scores(predicted, gold, n_classes)}
    return scores, predicted, gold


def evaluation_report(
    model: nn.Module, batches: typing.Iterable[Classified], labels: list[str]
) -> dict[str, typing.Any]:
    """`attnlab evaluate`'s record: loss, accuracy, macro-F1, the number of examples, the labels and
    the confusion matrix (rows: true class, columns: predicted)."""
    scores, predicted, gold = scores_of(model, batches, len(labels), next(model.parameters()).device)
    return {
        "loss": scores["valid_loss"],
        "accuracy": scores["accuracy"],
        "macro_f1": scores["macro_f1"],
        "examples": len(gold),
        "labels": labels,
        "confusion": confusion_matrix(predicted, gold, len(labels)),
    }


class LabelledData(typing.Protocol):
    """A classifier's data: ``labels``, the class names in class-id order, and its evaluation batches."""

    @property
    def labels(self) -> list[str]: ...

    def eval_batches(self, split: str) -> typing.Sequence[Classified]: ...


LD = typing.TypeVar("LD", bound=LabelledData)
CB = typing.TypeVar("CB", bound=Classified)


class ClassifierTask(Task[LD, CB]):
    """A task whose target is one class per example: the cross-entropy over examples, accuracy and
    macro-F1, and `evaluate --split`. Its batches are :class:`Classified`; its data,
    :class:`LabelledData`."""

    counts = "examples"  # sentences, images or nodes: one target each
    metrics = {"valid_loss": True, "accuracy": False, "macro_f1": False}

    def loss(self, model: nn.Module, batch: CB, label_smoothing: float, amp: Amp) -> tuple[Tensor, Tensor]:
        with amp():
            logits = batch.logits(model)
        return label_smoothed_nll(logits, batch.labels, label_smoothing, NO_LABEL)

    def validate(
        self, model: nn.Module, data: LD, device: torch.device, amp: Amp, n_decoded: int, split: str = "valid"
    ) -> dict[str, float]:
        return scores_of(model, data.eval_batches(split), len(data.labels), device, amp)[0]

    def evaluate_split(self, model: nn.Module, data: LD, split: str) -> dict[str, typing.Any]:
        return evaluation_report(model, data.eval_batches(split), data.labels)

    def report(self, result: dict[str, typing.Any], source: str) -> list[str]:
        """Accuracy, macro-F1 and loss, and the confusion matrix as text."""
        return [
            f"accuracy  {result['accuracy']:.2%}   macro-F1  {result['macro_f1']:.4f}   loss  {result['loss']:.4f}   "
            f"({result['examples']} examples, {source})",
            "confusion matrix (rows: true label, columns: predicted)",
            *confusion_table(result["labels"], result["confusion"]),
        ]
