"""The encoder-decoder of "Attention Is All You Need": logits = Generator(Decoder(Embed(y), Encoder(Embed(x))))."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import nn

from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, Depths, FamilyConfig, Staging, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig
from attnlab.models.transformer_config import (
    TWO_TABLE_TIES,
    Output,
    Positions,
    TokenEmbeddings,
    TransformerConfig,
    TransformerFamily,
)
from attnlab.nn.backends import BackendOptions
from attnlab.nn.embeddings import Embeddings
from attnlab.nn.encoder_decoder import EncoderDecoder
from attnlab.nn.layers import Encoder, Seq2SeqDecoder

SEQ2SEQ_VOCABULARIES = ("all", "no_bos")  # output.vocabulary of a model with a decoder that <bos> starts


@dataclass(frozen=True)
class EncoderDecoderConfig(FamilyConfig):
    """The Transformer fields, plus separate stack depths (``depths``: ``encoder``, ``decoder``,
    default: the stack's ``n_layers``) and the ``output`` projection (models/transformer_config.py:
    Output; ``output.bias``, Marian's final_logits_bias; ``output.vocabulary`` ``all`` or ``no_bos``,
    an imported Marian model's added start token, which only starts the decoder, never predicted)."""

    stack: StackConfig = StackConfig()
    positions: Positions = Positions()
    embeddings: TokenEmbeddings = TokenEmbeddings()
    backends: BackendOptions = BackendOptions()

    depths: Depths = Depths()
    output: Output = Output()

    def check(self) -> None:
        super().check()
        self.output.check_vocabulary(SEQ2SEQ_VOCABULARIES)

    @property
    def encoder_layers(self) -> int:
        return self.depths.encoder_layers(self.stack.n_layers)

    @property
    def decoder_layers(self) -> int:
        return self.depths.decoder_layers(self.stack.n_layers)


class TwoSided(TransformerConfig, Protocol):
    """What :func:`seq2seq_parts` reads of a config besides the Transformer fields (the part builders'):
    the encoder-decoder's and CMLM's, which compose the same ``depths`` and ``output``."""

    @property
    def arch(self) -> str: ...

    @property
    def encoder_layers(self) -> int: ...

    @property
    def decoder_layers(self) -> int: ...

    @property
    def output(self) -> Output: ...


def check_untied(cfg: EncoderDecoderConfig) -> None:
    """A pipeline's first stage holds the source embedding, the stage with the encoder's last layer the target's."""
    if "src_tgt" in cfg.tied:
        raise ConfigError(
            f"train.strategy pp: model.embeddings.tie '{cfg.embeddings.tie}' shares the source "
            f"embedding (first stage) with the target embedding (the stage where the decoder "
            f"starts); set it to none"
        )


@register_family
class EncoderDecoderFamily(TransformerFamily):
    name = "encoder_decoder"
    config = EncoderDecoderConfig
    ties = TWO_TABLE_TIES
    capabilities = Capabilities(encoder=True, decoder=True, incremental_decoding=True, attention_weights=True)
    staging = Staging(lambda cfg: cfg.encoder_layers + cfg.decoder_layers, check=check_untied)

    @staticmethod
    def build(cfg: EncoderDecoderConfig, shape: DataShape) -> EncoderDecoder:
        model = EncoderDecoder(*seq2seq_parts(cfg, shape), shape.pad_id)
        parts.init_weights(model)
        return model


def seq2seq_parts(
    cfg: TwoSided, shape: DataShape, causal: bool = True
) -> tuple[Embeddings, Embeddings, Encoder, Seq2SeqDecoder, nn.Linear]:
    """Source and target embeddings (tied as configured), encoder, decoder (``causal``: masked
    self-attention; else every target position sees every other) and output projection."""
    vocab_size = shape.need("vocab_size", f"arch '{cfg.arch}'")
    src_embed = parts.embeddings(cfg, shape.src_vocab or vocab_size)
    tgt_embed = parts.embeddings(cfg, vocab_size)
    if "src_tgt" in cfg.tied:
        tgt_embed.tokens = src_embed.tokens
    return (
        src_embed,
        tgt_embed,
        parts.encoder(cfg, cfg.encoder_layers),
        parts.decoder(cfg, cfg.decoder_layers, cross=True, causal=causal),
        parts.output_projection(cfg, tgt_embed, vocab_size, cfg.output.never, bias=cfg.output.bias),
    )
