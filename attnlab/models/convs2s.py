"""The convolutional encoder-decoder of Gehring et al. (2017), ConvS2S (fairseq's ``fconv``): gated
convolutions on both sides and an attention over the encoder at every decoder layer (nn/convs2s.py)."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import at_least, flattened
from attnlab.models.family import Capabilities, Depths, FamilyConfig, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig
from attnlab.models.transformer_config import Positions
from attnlab.nn.convs2s import ConvDecoder, ConvEncoder, ConvSeq2Seq, conv_embedding
from attnlab.nn.embeddings import Embeddings


@dataclass(frozen=True)
class ConvS2SConfig(FamilyConfig):
    """``d_embed``: the embeddings and the attention's size (fairseq's embed and out-embed dims);
    ``d_model``: the convolutions' channels; ``kernel_width``: each convolution's k (the decoder's
    see positions t - k + 1 .. t); ``max_len``: the learnt positions. Dessì & Baroni (2019) set
    d_embed = d_model."""

    d_embed: int = 512
    # d_model, n_layers and dropout: a StackConfig's (N layers of width d_model), max_len: a Positions'
    # (scheme learned), composed flattened (config.flattened): written in the section (model.d_model), the
    # parts' other fields kept at defaults that no value of these refuses (one head), and no attention
    # stack (models/stack.py)
    stack: StackConfig = flattened(
        StackConfig(d_model=512, n_heads=1, n_layers=6, dropout=0.1), ("d_model", "n_layers", "dropout")
    )
    depths: Depths = Depths()
    kernel_width: int = 3
    positions: Positions = flattened(Positions(scheme="learned", max_len=1024), ("max_len",))

    def check(self) -> None:
        at_least("d_embed", self.d_embed, 1)  # d_model, n_layers, dropout and max_len: their parts check them
        at_least("kernel_width", self.kernel_width, 2)

    @property
    def max_positions(self) -> int:
        return self.positions.max_len

    @property
    def longest_sequence(self) -> int:
        return self.positions.max_len

    @property
    def encoder_layers(self) -> int:
        return self.depths.encoder_layers(self.stack.n_layers)

    @property
    def decoder_layers(self) -> int:
        return self.depths.decoder_layers(self.stack.n_layers)


@register_family
class ConvS2SFamily(ModelFamily):
    name = "convs2s"
    config = ConvS2SConfig
    capabilities = Capabilities(encoder=True, decoder=True, incremental_decoding=True, attention_weights=False)

    @staticmethod
    def build(cfg: ConvS2SConfig, shape: DataShape) -> ConvSeq2Seq:
        vocab_size = shape.need("vocab_size", "arch 'convs2s'")
        d_model, dropout = cfg.stack.d_model, cfg.stack.dropout

        def embedding(rows: int) -> Embeddings:
            return conv_embedding(rows, cfg.d_embed, cfg.positions.max_len, shape.pad_id, dropout)

        encoder = ConvEncoder(
            embedding(shape.src_vocab or vocab_size),
            d_model,
            cfg.encoder_layers,
            cfg.kernel_width,
            dropout,
            grad_scale=1.0 / (2 * cfg.decoder_layers),
        )
        decoder = ConvDecoder(embedding(vocab_size), d_model, cfg.decoder_layers, cfg.kernel_width, dropout, vocab_size)
        return ConvSeq2Seq(encoder, decoder, shape.pad_id)
