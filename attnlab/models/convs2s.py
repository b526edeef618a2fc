"""The convolutional encoder-decoder of Gehring et al. (2017), ConvS2S (fairseq's ``fconv``): gated
convolutions on both sides and an attention over the encoder at every decoder layer (nn/convs2s.py)."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import at_least
from attnlab.errors import ConfigError
from attnlab.models.family import Capabilities, Depths, FamilyConfig, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.nn.convs2s import ConvDecoder, ConvEncoder, ConvSeq2Seq, conv_embedding
from attnlab.nn.embeddings import Embeddings


@dataclass(frozen=True)
class ConvS2SConfig(FamilyConfig):
    """``d_embed``: the embeddings and the attention's size (fairseq's embed and out-embed dims);
    ``d_model``: the convolutions' channels; ``kernel_width``: each convolution's k (the decoder's
    see positions t - k + 1 .. t); ``max_len``: the learnt positions. Dessì & Baroni (2019) set
    d_embed = d_model."""

    d_embed: int = 512
    d_model: int = 512
    n_layers: int = 6
    depths: Depths = Depths()
    kernel_width: int = 3
    dropout: float = 0.1
    max_len: int = 1024

    def check(self) -> None:
        for name in ("d_embed", "d_model", "n_layers", "max_len"):
            at_least(name, getattr(self, name), 1)
        at_least("kernel_width", self.kernel_width, 2)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1) (got {self.dropout})")

    @property
    def max_positions(self) -> int:
        return self.max_len

    @property
    def longest_sequence(self) -> int:
        return self.max_len

    @property
    def encoder_layers(self) -> int:
        return self.depths.encoder_layers(self.n_layers)

    @property
    def decoder_layers(self) -> int:
        return self.depths.decoder_layers(self.n_layers)


@register_family
class ConvS2SFamily(ModelFamily):
    name = "convs2s"
    config = ConvS2SConfig
    capabilities = Capabilities(encoder=True, decoder=True, incremental_decoding=True, attention_weights=False)

    @staticmethod
    def build(cfg: ConvS2SConfig, shape: DataShape) -> ConvSeq2Seq:
        vocab_size = shape.need("vocab_size", "arch 'convs2s'")

        def embedding(rows: int) -> Embeddings:
            return conv_embedding(rows, cfg.d_embed, cfg.max_len, shape.pad_id, cfg.dropout)

        encoder = ConvEncoder(
            embedding(shape.src_vocab or vocab_size),
            cfg.d_model,
            cfg.encoder_layers,
            cfg.kernel_width,
            cfg.dropout,
            grad_scale=1.0 / (2 * cfg.decoder_layers),
        )
        decoder = ConvDecoder(
            embedding(vocab_size), cfg.d_model, cfg.decoder_layers, cfg.kernel_width, cfg.dropout, vocab_size
        )
        return ConvSeq2Seq(encoder, decoder, shape.pad_id)
