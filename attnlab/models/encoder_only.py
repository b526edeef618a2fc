"""The encoder-only model (BERT): masked-LM logits, or class logits from a pooled vector."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import at_least
from attnlab.models import transformer as parts
from attnlab.models.classifier import Classifier
from attnlab.models.family import Capabilities, FamilyConfig, Staging, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig
from attnlab.models.transformer_config import Positions, TokenEmbeddings, TransformerFamily
from attnlab.nn.backends import BackendOptions
from attnlab.nn.encoder_only import EncoderOnly
from attnlab.nn.heads import MaskedLMHead
from attnlab.nn.registry import ACTIVATIONS

PRETRAINING_CLASSES = 2  # the head of data with no classes (a masked LM's): BERT's next-sentence head's


@dataclass(frozen=True)
class EncoderOnlyConfig(FamilyConfig):
    """The Transformer fields, plus the ``classifier`` (``pooling`` ``cls``: the first position,
    BERT's [CLS]; ``head`` ``pooled``: BERT's pooler before the output), and ``n_segments``, the rows of the segment
    table (BERT's token types; 2 for sentence pairs, 0 for none; data of sentence pairs sets 2:
    DataShape.segments). The head's classes are the data's (DataShape.n_classes); a masked LM's data
    has none, and its untrained head, which fine-tuning replaces, has BERT's next-sentence two."""

    stack: StackConfig = StackConfig()
    positions: Positions = Positions()
    embeddings: TokenEmbeddings = TokenEmbeddings()
    backends: BackendOptions = BackendOptions()

    classifier: Classifier = Classifier()
    n_segments: int = 0

    def check(self) -> None:
        super().check()
        at_least("n_segments", self.n_segments, 0)

    def segment_rows(self, shape: DataShape) -> int:
        """The rows of the segment table: the data's segments (2 for pairs), else ``n_segments``."""
        return shape.segments if shape.segments is not None else self.n_segments

    @property
    def encoder_layers(self) -> int:
        return self.stack.n_layers


@register_family
class EncoderOnlyFamily(TransformerFamily):
    name = "encoder_only"
    config = EncoderOnlyConfig
    capabilities = Capabilities(encoder=True, decoder=False, incremental_decoding=False, attention_weights=True)
    staging = Staging(lambda cfg: cfg.encoder_layers, heads=("forward", "classify"))

    @staticmethod
    def build(cfg: EncoderOnlyConfig, shape: DataShape) -> EncoderOnly:
        vocab_size = shape.need("vocab_size", "arch 'encoder_only'")
        embed = parts.embeddings(cfg, vocab_size, cfg.segment_rows(shape))
        mlm_head = MaskedLMHead(
            cfg.stack.d_model,
            ACTIVATIONS[cfg.stack.activation](),
            cfg.stack.layer_norm_eps,
            parts.output_projection(cfg, embed, vocab_size),
        )
        n_classes = shape.n_classes if shape.n_classes is not None else PRETRAINING_CLASSES
        classifier = cfg.classifier.build(cfg.stack.d_model, n_classes, cfg.stack.dropout)
        model = EncoderOnly(embed, parts.encoder(cfg, cfg.stack.n_layers), mlm_head, classifier, shape.pad_id)
        parts.init_weights(model)
        return model
