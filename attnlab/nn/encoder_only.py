"""The encoder-only (BERT-style) model: masked-LM logits, or class logits from a pooled vector."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from attnlab.nn.embeddings import Embeddings
from attnlab.nn.heads import MaskedLMHead
from attnlab.nn.layers import Encoder, EncoderLayer
from attnlab.nn.stages import Carried, Stage, layer_ranges
from attnlab.nn.tensor_plan import TensorPlan, megatron


class EncoderOnly(nn.Module):
    """BERT-style encoder. ``model(ids)`` -> (B, T, V) masked-LM logits; ``model.classify(ids)`` ->
    (B, n_classes) from the pooled sequence (first-token pooling wants a CLS token there). With
    segment embeddings, ``segments`` (B, T) says which sentence of a pair each token is in."""

    def __init__(
        self, embed: Embeddings, encoder: Encoder, mlm_head: MaskedLMHead, classifier: nn.Module, pad_id: int
    ) -> None:
        super().__init__()
        self.embed, self.encoder = embed, encoder
        self.mlm_head, self.classifier = mlm_head, classifier
        self.pad_id = pad_id

    def encode(self, ids: Tensor, segments: Tensor | None = None) -> Tensor:
        """(B, T) ids -> (B, T, d_model) contextual vectors."""
        positions = self.embed.positions(0, ids.shape[1], ids.device)
        return self.encoder(self.embed(ids, positions, segments), ids != self.pad_id, positions)

    def forward(self, ids: Tensor, segments: Tensor | None = None) -> Tensor:
        return self.mlm_head(self.encode(ids, segments))

    def classify(self, ids: Tensor, segments: Tensor | None = None) -> Tensor:
        return self.classifier(self.encode(ids, segments), ids != self.pad_id)

    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of the encoder's layers (train.strategy tp, nn/tensor_plan.py)."""
        return megatron(self, "encoder")

    def stages(self, n: int, head: str = "forward") -> list[EncoderStage]:
        """The model cut into ``n`` pipeline stages of consecutive layers (nn/stages.py), the last
        ending with ``head``: 'forward' (masked-LM logits) or 'classify'."""
        return [EncoderStage(self, layers, head) for layers in layer_ranges(len(self.encoder.layers), n)]


class EncoderStage(Stage):
    """Layers ``layers`` of an EncoderOnly (its own modules, shared): (B, T) ids (and segments) into
    the first stage; between stages the (B, T, d_model) states and the (B, T) real tokens, which
    every layer's mask and the pooling read; out of the last, (B, T, V) masked-LM logits, or with
    ``head`` 'classify' (B, n_classes) class logits."""

    def __init__(self, model: EncoderOnly, layers: range, head: str = "forward") -> None:
        super().__init__(layers, len(model.encoder.layers))
        self.embed = model.embed if self.first else None
        self.encoder = Encoder(
            # an Encoder's ModuleList holds the EncoderLayers it was built from
            [cast(EncoderLayer, model.encoder.layers[i]) for i in layers],
            model.encoder.norm if self.last else nn.Identity(),
        )
        self.pooled = head == "classify"
        self.head = (model.classifier if self.pooled else model.mlm_head) if self.last else None
        self.pad_id = model.pad_id

    def enter(self, ids: Tensor, segments: Tensor | None = None) -> Carried:
        positions = torch.arange(ids.shape[1], device=ids.device)
        embed = cast(Embeddings, self.embed)  # set on the first stage, the only one that enters
        return embed(ids, positions, segments), ids != self.pad_id  # (B, T, d_model), (B, T)

    def through(self, x: Tensor, valid: Tensor) -> Carried:
        return self.encoder(x, valid, torch.arange(x.shape[1], device=x.device)), valid

    def leave(self, x: Tensor, valid: Tensor) -> Tensor:
        head = cast(nn.Module, self.head)  # set on the last stage, the only one that leaves
        return head(x, valid) if self.pooled else head(x)
