"""The encoder-decoder of "Attention Is All You Need": logits = Generator(Decoder(Embed(y), Encoder(Embed(x))))."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from attnlab.config import at_least
from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, ModelFamily, register_family
from attnlab.models.transformer import TransformerConfig
from attnlab.nn.transformer import EncoderDecoder


@dataclass(frozen=True)
class EncoderDecoderConfig(TransformerConfig):
    """The Transformer fields, plus a source vocabulary (``src_vocab_size``, default: the target's)
    and separate stack depths (``n_encoder_layers``, ``n_decoder_layers``, default: ``n_layers``)."""

    src_vocab_size: Optional[int] = None
    n_encoder_layers: Optional[int] = None
    n_decoder_layers: Optional[int] = None

    ties = ("none", "output", "src_tgt", "all")

    def check(self) -> None:
        for name in ("src_vocab_size", "n_encoder_layers", "n_decoder_layers"):
            if getattr(self, name) is not None:
                at_least(name, getattr(self, name), 1)
        super().check()
        if "src_tgt" in self.tied and self.src_vocab != self.vocab_size:
            raise ConfigError(f"tie_embeddings '{self.tie_embeddings}' shares source and target embeddings, so "
                              f"src_vocab_size ({self.src_vocab_size}) must equal vocab_size ({self.vocab_size}); "
                              f"use tie_embeddings 'output' or 'none' for separate vocabularies")

    @property
    def src_vocab(self) -> int:
        return self.src_vocab_size if self.src_vocab_size is not None else self.vocab_size

    @property
    def vocab_sizes(self) -> tuple[int, ...]:
        return (self.vocab_size, self.src_vocab)

    @property
    def encoder_layers(self) -> int:
        return self.n_encoder_layers if self.n_encoder_layers is not None else self.n_layers

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @property
    def tied(self) -> tuple[str, ...]:
        return {"none": (), "output": ("output",), "src_tgt": ("src_tgt",),
                "all": ("output", "src_tgt")}[self.tie_embeddings]


@register_family
class EncoderDecoderFamily(ModelFamily):
    name = "encoder_decoder"
    config = EncoderDecoderConfig
    capabilities = Capabilities(encoder=True, decoder=True, incremental_decoding=True, attention_weights=True)

    @staticmethod
    def build(cfg: EncoderDecoderConfig) -> EncoderDecoder:
        src_embed = parts.embeddings(cfg, cfg.src_vocab)
        tgt_embed = parts.embeddings(cfg, cfg.vocab_size)
        if "src_tgt" in cfg.tied:
            tgt_embed.tokens = src_embed.tokens
        model = EncoderDecoder(src_embed, tgt_embed, parts.encoder(cfg, cfg.encoder_layers),
                               parts.decoder(cfg, cfg.decoder_layers, cross=True),
                               parts.output_projection(cfg, tgt_embed), cfg.pad_id)
        parts.init_weights(model)
        return model
