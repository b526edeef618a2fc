"""The decoder-only language model (GPT): logits = Generator(Decoder(Embed(x))), causal, no cross-attention."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, ModelFamily, register_family
from attnlab.models.transformer import TransformerConfig
from attnlab.nn.transformer import DecoderLM


@dataclass(frozen=True)
class DecoderLMConfig(TransformerConfig):
    """The Transformer fields; one stack of ``n_layers`` decoder layers, one embedding table."""

    @property
    def decoder_layers(self) -> int:
        return self.n_layers


@register_family
class DecoderLMFamily(ModelFamily):
    name = "decoder_lm"
    config = DecoderLMConfig
    capabilities = Capabilities(encoder=False, decoder=True, incremental_decoding=True, attention_weights=True)

    @staticmethod
    def build(cfg: DecoderLMConfig) -> DecoderLM:
        embed = parts.embeddings(cfg, cfg.vocab_size)
        model = DecoderLM(embed, parts.decoder(cfg, cfg.n_layers, cross=False), parts.output_projection(cfg, embed),
                          cfg.pad_id)
        parts.init_weights(model)
        return model
