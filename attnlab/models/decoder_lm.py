"""The decoder-only language model (GPT): logits = Generator(Decoder(Embed(x))), causal, no cross-attention;
optionally with multi-token prediction heads (Gloeckle et al. 2024)."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import at_least
from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, FamilyConfig, Staging, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig
from attnlab.models.transformer_config import Output, Positions, TokenEmbeddings, TransformerFamily
from attnlab.nn.backends import BackendOptions
from attnlab.nn.decoder_lm import DecoderLM
from attnlab.nn.feedforward import PositionWiseFeedForward
from attnlab.nn.heads import MultiTokenHead
from attnlab.nn.layers import ResidualConnection
from attnlab.nn.registry import ACTIVATIONS

LM_VOCABULARIES = ("all", "text")  # output.vocabulary of a language model


@dataclass(frozen=True)
class DecoderLMConfig(FamilyConfig):
    """The Transformer fields; one stack of ``n_layers`` decoder layers, one embedding table.
    ``multi_token_heads``: k extra heads that predict tokens t + 2 ... t + k + 1 (a draft for
    self-speculative decoding); ``multi_token_weight``: each one's weight in the training loss,
    beside the next-token loss's 1. ``output``: the output projection (models/transformer_config.py:
    Output; ``output.vocabulary`` ``all``, every token id may be predicted, or ``text``, the control
    tokens <pad>, <bos> and <unk> never are: a pretrained model imported from a vocabulary without
    them, GPT-2's, interop/gpt2.py, whose distribution over its own tokens and <eos> stays exactly
    the original's)."""

    stack: StackConfig = StackConfig()
    positions: Positions = Positions()
    embeddings: TokenEmbeddings = TokenEmbeddings()
    backends: BackendOptions = BackendOptions()

    multi_token_heads: int = 0
    multi_token_weight: float = 1.0
    output: Output = Output()

    def check(self) -> None:
        super().check()
        self.output.check_vocabulary(LM_VOCABULARIES)
        at_least("multi_token_heads", self.multi_token_heads, 0)
        if not self.multi_token_weight > 0:
            raise ConfigError(f"multi_token_weight must be > 0 (got {self.multi_token_weight})")

    def check_shape(self, shape: DataShape) -> None:
        super().check_shape(shape)
        self.output.check_shape(shape)

    @property
    def decoder_layers(self) -> int:
        return self.stack.n_layers


def check_one_head(cfg: DecoderLMConfig) -> None:
    """A pipeline's last stage ends with the next-token head alone."""
    if cfg.multi_token_heads:
        raise ConfigError("train.strategy pp: model.multi_token_heads are not cut into stages; set it to 0")


def multi_token_head(cfg: DecoderLMConfig) -> MultiTokenHead:
    """A pre-norm residual feed-forward block of the model's sizes, whatever the trunk's norm placement."""
    ffn = PositionWiseFeedForward(cfg.stack.d_model, cfg.stack.d_ff, ACTIVATIONS[cfg.stack.activation]())
    return MultiTokenHead(
        ffn, ResidualConnection(cfg.stack.d_model, cfg.stack.dropout, "pre", cfg.stack.layer_norm_eps)
    )


@register_family
class DecoderLMFamily(TransformerFamily):
    name = "decoder_lm"
    config = DecoderLMConfig
    capabilities = Capabilities(encoder=False, decoder=True, incremental_decoding=True, attention_weights=True)
    staging = Staging(lambda cfg: cfg.decoder_layers, check=check_one_head)

    @staticmethod
    def build(cfg: DecoderLMConfig, shape: DataShape) -> DecoderLM:
        vocab_size = shape.need("vocab_size", "arch 'decoder_lm'")
        embed = parts.embeddings(cfg, vocab_size)
        heads = [multi_token_head(cfg) for _ in range(cfg.multi_token_heads)]
        model = DecoderLM(
            embed,
            parts.decoder(cfg, cfg.stack.n_layers, cross=False),
            parts.output_projection(cfg, embed, vocab_size, cfg.output.never, bias=cfg.output.bias),
            shape.pad_id,
            heads,
            cfg.multi_token_weight,
        )
        parts.init_weights(model)
        return model
