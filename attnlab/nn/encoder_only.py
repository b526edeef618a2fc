"""The encoder-only (BERT-style) model: masked-LM logits, or class logits from a pooled vector."""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.nn.embeddings import Embeddings
from attnlab.nn.heads import ClassificationHead, MaskedLMHead
from attnlab.nn.stacks import Encoder


class EncoderOnly(nn.Module):
    """BERT-style encoder. ``model(ids)`` -> (B, T, V) masked-LM logits; ``model.classify(ids)`` ->
    (B, n_classes) from the pooled sequence (first-token pooling wants a CLS token there). With
    segment embeddings, ``segments`` (B, T) says which sentence of a pair each token is in."""

    def __init__(self, embed: Embeddings, encoder: Encoder, mlm_head: MaskedLMHead,
                 classifier: ClassificationHead, pad_id: int) -> None:
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
