"""The encoder-only model (BERT): masked-LM logits, or class logits from a pooled vector."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import at_least, one_of
from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, ModelFamily, Staging, register_family
from attnlab.models.transformer import TransformerConfig
from attnlab.nn.encoder_only import EncoderOnly
from attnlab.nn.heads import ClassificationHead, MaskedLMHead
from attnlab.nn.registry import ACTIVATIONS, POOLINGS


@dataclass(frozen=True)
class EncoderOnlyConfig(TransformerConfig):
    """The Transformer fields, plus the classification head's ``n_classes`` and ``pooling`` (``cls``:
    the first position, BERT; ``mean``: the mean over real tokens), and ``n_segments``, the rows of
    the segment table (BERT's token types; 2 for sentence pairs, 0 for none)."""

    n_classes: int = 2
    pooling: str = "cls"
    n_segments: int = 0

    def check(self) -> None:
        super().check()
        at_least("n_classes", self.n_classes, 2)
        one_of("pooling", self.pooling, POOLINGS)
        at_least("n_segments", self.n_segments, 0)

    @property
    def encoder_layers(self) -> int:
        return self.stack.n_layers


@register_family
class EncoderOnlyFamily(ModelFamily):
    name = "encoder_only"
    config = EncoderOnlyConfig
    capabilities = Capabilities(encoder=True, decoder=False, incremental_decoding=False, attention_weights=True)
    staging = Staging(lambda cfg: cfg.encoder_layers, heads=("forward", "classify"))

    @staticmethod
    def build(cfg: EncoderOnlyConfig) -> EncoderOnly:
        embed = parts.embeddings(cfg, cfg.vocab_size, cfg.n_segments)
        mlm_head = MaskedLMHead(cfg.stack.d_model, ACTIVATIONS[cfg.stack.activation](), cfg.stack.layer_norm_eps,
                                parts.output_projection(cfg, embed))
        classifier = ClassificationHead(cfg.stack.d_model, cfg.n_classes, cfg.stack.dropout, POOLINGS[cfg.pooling]())
        model = EncoderOnly(embed, parts.encoder(cfg, cfg.stack.n_layers), mlm_head, classifier, cfg.pad_id)
        parts.init_weights(model)
        return model
