"""The encoder-decoder of "Attention Is All You Need": logits = Generator(Decoder(Embed(y), Encoder(Embed(x))))."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from attnlab.config import one_of
from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, Depths, ModelFamily, Staging, register_family
from attnlab.models.shape import DataShape
from attnlab.models.transformer import TransformerConfig
from attnlab.nn.embeddings import Embeddings
from attnlab.nn.encoder_decoder import EncoderDecoder
from attnlab.nn.layers import Encoder, Seq2SeqDecoder

NEVER = {"all": (), "no_bos": (1,)}  # output_vocabulary -> ids never predicted (<bos> of data/tokenizers.py)
OUTPUT_VOCABULARIES = tuple(NEVER)


@dataclass(frozen=True)
class EncoderDecoderConfig(TransformerConfig):
    """The Transformer fields, plus separate stack depths (``depths``: ``encoder``, ``decoder``, default: ``n_layers``).
    ``output_bias``: a bias per target token on the logits (Marian's final_logits_bias; the paper has none).
    ``output_vocabulary``: ``all``, every token id may be predicted; ``no_bos``, <bos>, which only
    starts the decoder, never is (its logit is -inf): an imported Marian model's added start token
    (interop/marian.py), so that the distribution over Marian's own tokens stays the original's."""

    depths: Depths = Depths()
    output_bias: bool = False
    output_vocabulary: str = "all"

    ties = ("none", "output", "src_tgt", "all")

    def check(self) -> None:
        super().check()
        one_of("output_vocabulary", self.output_vocabulary, OUTPUT_VOCABULARIES)

    def check_shape(self, shape: DataShape) -> None:
        if "src_tgt" in self.tied and shape.src_vocab_size not in (None, shape.vocab_size):
            raise ConfigError(f"tie_embeddings '{self.tie_embeddings}' shares source and target embeddings, so "
                              f"src_vocab_size ({shape.src_vocab_size}) must equal vocab_size ({shape.vocab_size}); "
                              f"use tie_embeddings 'output' or 'none' for separate vocabularies")

    @property
    def tied(self) -> tuple[str, ...]:
        return {"none": (), "output": ("output",), "src_tgt": ("src_tgt",),
                "all": ("output", "src_tgt")}[self.tie_embeddings]

    @property
    def encoder_layers(self) -> int:
        return self.depths.encoder_layers(self.stack.n_layers)

    @property
    def decoder_layers(self) -> int:
        return self.depths.decoder_layers(self.stack.n_layers)


def check_untied(cfg: EncoderDecoderConfig) -> None:
    """A pipeline's first stage holds the source embedding, the stage with the encoder's last layer the target's."""
    if "src_tgt" in cfg.tied:
        raise ConfigError(f"train.strategy pp: model.tie_embeddings '{cfg.tie_embeddings}' shares the source "
                          f"embedding (first stage) with the target embedding (the stage where the decoder "
                          f"starts); set it to none")


@register_family
class EncoderDecoderFamily(ModelFamily):
    name = "encoder_decoder"
    config = EncoderDecoderConfig
    capabilities = Capabilities(encoder=True, decoder=True, incremental_decoding=True, attention_weights=True)
    staging = Staging(lambda cfg: cfg.encoder_layers + cfg.decoder_layers, check=check_untied)

    @staticmethod
    def build(cfg: EncoderDecoderConfig, shape: DataShape) -> EncoderDecoder:
        model = EncoderDecoder(*seq2seq_parts(cfg, shape), shape.pad_id)
        parts.init_weights(model)
        return model


def seq2seq_parts(cfg: EncoderDecoderConfig, shape: DataShape, causal: bool = True
                  ) -> tuple[Embeddings, Embeddings, Encoder, Seq2SeqDecoder, nn.Linear]:
    """Source and target embeddings (tied as configured), encoder, decoder (``causal``: masked
    self-attention; else every target position sees every other) and output projection."""
    vocab_size = shape.need("vocab_size", f"arch '{cfg.arch}'")
    src_embed = parts.embeddings(cfg, shape.src_vocab or vocab_size)
    tgt_embed = parts.embeddings(cfg, vocab_size)
    if "src_tgt" in cfg.tied:
        tgt_embed.tokens = src_embed.tokens
    return (src_embed, tgt_embed, parts.encoder(cfg, cfg.encoder_layers),
            parts.decoder(cfg, cfg.decoder_layers, cross=True, causal=causal),
            parts.output_projection(cfg, tgt_embed, vocab_size, NEVER[cfg.output_vocabulary], bias=cfg.output_bias))
