"""Transformer-XL (Dai et al. 2019): a decoder-only language model that reads a text in consecutive
segments, each layer attending over the memory of the states it saw at the positions before the
segment (nn/memory.py). Trained and evaluated by data.task 'segment_language_model', which reads the
text in consecutive segments so that the memory of one batch is the context of the next."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import at_least
from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, FamilyConfig, Inputs, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig, explicit_masks
from attnlab.models.transformer_config import Positions, TokenEmbeddings, TransformerFamily
from attnlab.nn.backends import BackendOptions
from attnlab.nn.memory import MemoryDecoder, TransformerXL
from attnlab.nn.registry import POSITIONAL


@dataclass(frozen=True)
class TransformerXLConfig(FamilyConfig):
    """The Transformer fields, and Transformer-XL's own: ``memory_length`` M, the positions before a
    segment whose states each layer remembers (0: none, every segment read alone). The segments a
    text is read in, T, are the data's (DataShape.segment_length: data.block_size). Positions are
    relative, 'rotary' by default."""

    stack: StackConfig = StackConfig()
    positions: Positions = Positions(scheme="rotary")
    embeddings: TokenEmbeddings = TokenEmbeddings()
    backends: BackendOptions = BackendOptions()

    memory_length: int = 64

    def check(self) -> None:
        super().check()
        at_least("memory_length", self.memory_length, 0)
        if self.positions.absolute:
            relative = [name for name, cls in POSITIONAL.items() if not cls.absolute]
            raise ConfigError(
                f"positions.scheme '{self.positions.scheme}' numbers positions from the start of the input, and "
                f"Transformer-XL moves states from the segment into the memory: use one of "
                f"{', '.join(map(repr, relative))}"
            )

    @property
    def decoder_layers(self) -> int:
        return self.stack.n_layers


@register_family
class TransformerXLFamily(TransformerFamily):
    name = "transformer_xl"
    config = TransformerXLConfig
    # inputs: a token stream read in consecutive segments, row i of one batch continuing row i of the
    # last, so that the memory it carries is context (data.task 'segment_language_model')
    capabilities = Capabilities(
        encoder=False, decoder=True, incremental_decoding=True, attention_weights=True, inputs=Inputs.TOKEN_SEGMENTS
    )
    backends_fit = explicit_masks  # a function read from the class: no self
    backends_refusal = "takes padding and causality only; Transformer-XL's decoding window is an explicit mask"

    @staticmethod
    def build(cfg: TransformerXLConfig, shape: DataShape) -> TransformerXL:
        vocab_size = shape.need("vocab_size", "arch 'transformer_xl'")
        embed = parts.embeddings(cfg, vocab_size)
        decoder = MemoryDecoder(
            [parts.decoder_layer(cfg, cross=False) for _ in range(cfg.stack.n_layers)],
            parts.final_norm(cfg),
            cfg.memory_length,
        )
        model = TransformerXL(
            embed,
            decoder,
            parts.output_projection(cfg, embed, vocab_size),
            shape.pad_id,
            shape.need("segment_length", "arch 'transformer_xl'"),
        )
        parts.init_weights(model)
        return model
