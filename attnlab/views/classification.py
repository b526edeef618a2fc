"""A text classifier's views: an encoder-only run's (views/encoder.py), with the classes' probabilities."""

from __future__ import annotations

from typing import Any, cast

from torch import Tensor

from attnlab.nn.interfaces import Classifier
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.classification import Classification
from attnlab.views.encoder import EncoderView
from attnlab.views.session import Session
from attnlab.views.view import register_view, validation_start


@register_view(Classification)
class ClassificationView(EncoderView):
    predicts = True

    def example(self, run: RunDir, tokenizers: dict[str, Any]) -> str | None:
        first = validation_start(run)
        return None if first is None else tokenizers["src"].decode(first[0].ids)

    def read(self, session: Session, ids: Tensor, segments: Tensor) -> Tensor:
        return cast(Classifier, session.model).classify(ids, segments)  # a text classifier

    def outputs(self, session: Session, logits: Tensor) -> dict[str, Any]:
        return session.probabilities(logits[0])
