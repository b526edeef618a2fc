"""The classification head over an encoder's states (``model.classifier``), a part of every family
that classifies a whole input: BERT's encoder (``encoder_only``), the Vision Transformer (``vit``) and
the single-stream image-text encoder (``single_stream``).

    y = W_c tanh(W_p pool(h) + b_p) + b_c     head: pooled (BERT's pooler, ViT's pre-training head)
    y = W_c pool(h) + b_c                     head: linear (ViT fine-tuned, ViTForImageClassification)
    y = W_c LN(pool(h)) + b_c                 head: normed (the AST's, ASTForAudioClassification)

pool is the state at the first position (``cls``: BERT's [CLS], ViT's class token), the mean of the
first two (``distilled``: DeiT's and the AST's class and distillation tokens) or the mean of the real
positions' states (``mean``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from attnlab.config import TypedConfig, one_of
from attnlab.nn.heads import ClassificationHead
from attnlab.nn.registry import POOLINGS
from attnlab.nn.vision import LinearClassifier, NormedLinearClassifier

# head: the map from the pooled vector to the logits
HEADS: dict[str, type[nn.Module]] = {
    "pooled": ClassificationHead,
    "linear": LinearClassifier,
    "normed": NormedLinearClassifier,
}


@dataclass(frozen=True)
class Classifier(TypedConfig):
    """``pooling``: what summarises the states for the head (``cls``, the first position; ``distilled``,
    the mean of the first two; ``mean``, the mean over the real positions); ``head``: ``pooled``, a tanh
    layer before the output, ``linear``, the output alone, or ``normed``, a LayerNorm before it. Each family maps the pooling to its own module (ViT's ``cls``
    prepends a class token)."""

    section: ClassVar[str] = "model.classifier"

    pooling: str = "cls"
    head: str = "pooled"

    def check(self) -> None:
        one_of("classifier.pooling", self.pooling, POOLINGS)
        one_of("classifier.head", self.head, HEADS)

    def build(self, d_model: int, n_classes: int, dropout: float, pooling: nn.Module | None = None) -> nn.Module:
        """The head of ``n_classes`` logits over states of width ``d_model``; ``pooling``: the family's
        own module for ``self.pooling`` (ViT's summary's), else the registry's."""
        return HEADS[self.head](d_model, n_classes, dropout, pooling or POOLINGS[self.pooling]())
