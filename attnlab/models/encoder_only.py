"""The encoder-only model (BERT): masked-LM logits, or class logits from the first position."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import at_least
from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, ModelFamily, register_family
from attnlab.models.transformer import TransformerConfig
from attnlab.nn.registry import ACTIVATIONS
from attnlab.nn.transformer import ClassificationHead, EncoderOnly, MaskedLMHead


@dataclass(frozen=True)
class EncoderOnlyConfig(TransformerConfig):
    """The Transformer fields, plus ``n_classes`` for the classification head."""

    n_classes: int = 2

    def check(self) -> None:
        super().check()
        at_least("n_classes", self.n_classes, 2)

    @property
    def encoder_layers(self) -> int:
        return self.n_layers


@register_family
class EncoderOnlyFamily(ModelFamily):
    name = "encoder_only"
    config = EncoderOnlyConfig
    capabilities = Capabilities(encoder=True, decoder=False, incremental_decoding=False, attention_weights=True)

    @staticmethod
    def build(cfg: EncoderOnlyConfig) -> EncoderOnly:
        embed = parts.embeddings(cfg, cfg.vocab_size)
        mlm_head = MaskedLMHead(cfg.d_model, ACTIVATIONS[cfg.activation](), cfg.layer_norm_eps,
                                parts.output_projection(cfg, embed))
        model = EncoderOnly(embed, parts.encoder(cfg, cfg.n_layers), mlm_head,
                            ClassificationHead(cfg.d_model, cfg.n_classes, cfg.dropout), cfg.pad_id)
        parts.init_weights(model)
        return model
