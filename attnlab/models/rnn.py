"""The recurrent encoder-decoder the Transformer replaced: a (bidirectional) RNN encoder and an RNN
decoder with one fixed context vector (Sutskever et al. 2014, Cho et al. 2014), Bahdanau (additive)
attention or Luong attention with input feeding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import nn

from attnlab.config import at_least, one_of
from attnlab.errors import ConfigError
from attnlab.models.family import Capabilities, Depths, FamilyConfig, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.models.transformer import SINGLE_STACK_TIES, init_weights
from attnlab.nn.registry import RNN_ATTENTION, RNN_CELLS, SCORES
from attnlab.nn.rnn import LakeBaroniDecoder, RNNDecoder, RNNEncoder, RNNSeq2Seq

RNN_DECODERS = ("deep_output", "lake_baroni")  # nn/rnn.py's RNNDecoder and LakeBaroniDecoder


@dataclass(frozen=True)
class RNNConfig(FamilyConfig):
    """``d_model`` is the embedding and hidden size of every cell; ``rnn_attention: none`` is a
    fixed context; ``score`` is the alignment score of the attention; ``max_len`` bounds the
    positions of the ``location`` score; ``teacher_forcing``: the probability that a training
    sequence reads the true prefix (the rest are decoded free-running, nn/rnn.py); ``rnn_decoder``:
    ``deep_output`` (a learnt initial state, the context at every step, o_t = tanh(W_o [s_t; c_t; E y]))
    or ``lake_baroni`` (Lake & Baroni 2018: the encoder's final states start it, p from s_t alone);
    ``dropout`` acts between layers and on the decoder's outputs, ``embedding_dropout`` (default: the
    same) on both sides' embeddings, as fairseq's LSTM separates its dropout-in from its dropout-out.
    Embeddings may tie the output projection only (``all`` = ``output``): source and target tables
    stay separate."""

    d_model: int = 512
    n_layers: int = 6
    depths: Depths = Depths()
    dropout: float = 0.1
    embedding_dropout: Optional[float] = None
    max_len: int = 1024
    tie_embeddings: str = "all"
    rnn_cell: str = "gru"
    rnn_attention: str = "bahdanau"
    score: str = "additive"
    bidirectional: bool = True
    input_feeding: bool = True
    teacher_forcing: float = 1.0
    rnn_decoder: str = "deep_output"

    def check(self) -> None:
        one_of("rnn_cell", self.rnn_cell, RNN_CELLS)
        one_of("rnn_attention", self.rnn_attention, RNN_ATTENTION)
        one_of("score", self.score, SCORES)
        one_of("rnn_decoder", self.rnn_decoder, RNN_DECODERS)
        if self.rnn_decoder == "lake_baroni":
            if self.rnn_attention == "luong" or self.bidirectional or self.encoder_layers != self.decoder_layers:
                raise ConfigError(
                    "rnn_decoder 'lake_baroni' starts from the encoder's final states and attends as "
                    "Bahdanau: it needs rnn_attention 'none' or 'bahdanau', bidirectional: false and "
                    "as many encoder as decoder layers"
                )
        if self.score in ("dot", "scaled_dot", "cosine") and self.bidirectional:
            raise ConfigError(
                f"score '{self.score}' compares the decoder state (d_model) with encoder states of "
                f"size 2 x d_model (bidirectional): use 'general' or 'additive', or bidirectional: false"
            )
        if self.tie_embeddings == "src_tgt":
            raise ConfigError("tie_embeddings 'src_tgt' needs arch 'encoder_decoder' (arch is 'rnn')")
        one_of("tie_embeddings", self.tie_embeddings, SINGLE_STACK_TIES)
        for name in ("d_model", "n_layers", "max_len"):
            at_least(name, getattr(self, name), 1)
        for name in ("dropout", "embedding_dropout"):
            p = getattr(self, name)
            if p is not None and not 0.0 <= p < 1.0:
                raise ConfigError(f"{name} must be in [0, 1) (got {p})")
        if not 0.0 <= self.teacher_forcing <= 1.0:
            raise ConfigError(
                f"teacher_forcing is the probability that a training sequence reads the true "
                f"prefix: it must be in [0, 1] (got {self.teacher_forcing})"
            )

    @property
    def embed_dropout(self) -> float:
        return self.dropout if self.embedding_dropout is None else self.embedding_dropout

    @property
    def longest_sequence(self) -> int:
        return self.max_len

    @property
    def tied(self) -> tuple[str, ...]:
        return () if self.tie_embeddings == "none" else ("output",)

    @property
    def encoder_layers(self) -> int:
        return self.depths.encoder_layers(self.n_layers)

    @property
    def decoder_layers(self) -> int:
        return self.depths.decoder_layers(self.n_layers)


@register_family
class RNNFamily(ModelFamily):
    name = "rnn"
    config = RNNConfig
    capabilities = Capabilities(encoder=True, decoder=True, incremental_decoding=True, attention_weights=False)

    @staticmethod
    def build(cfg: RNNConfig, shape: DataShape) -> RNNSeq2Seq:
        cell = RNN_CELLS[cfg.rnn_cell]
        vocab_size = shape.need("vocab_size", "arch 'rnn'")
        src_embed = nn.Embedding(shape.src_vocab or vocab_size, cfg.d_model)
        tgt_embed = nn.Embedding(vocab_size, cfg.d_model)
        carries = cfg.rnn_decoder == "lake_baroni"
        encoder = RNNEncoder(
            src_embed, cell, cfg.d_model, cfg.encoder_layers, cfg.bidirectional, cfg.dropout, cfg.embed_dropout, carries
        )
        score = None
        if cfg.rnn_attention != "none":
            score = SCORES[cfg.score](cfg.d_model, encoder.out_dim, d_attn=cfg.d_model, max_len=cfg.max_len)
        decoder: LakeBaroniDecoder | RNNDecoder
        if carries:
            decoder = LakeBaroniDecoder(
                tgt_embed, cell, cfg.d_model, cfg.decoder_layers, score, cfg.dropout, cfg.embed_dropout
            )
        else:
            decoder = RNNDecoder(
                tgt_embed,
                cell,
                cfg.d_model,
                encoder.out_dim,
                cfg.decoder_layers,
                cfg.rnn_attention,
                score,
                cfg.input_feeding,
                cfg.dropout,
                cfg.embed_dropout,
            )
        generator = nn.Linear(cfg.d_model, vocab_size, bias=False)
        if "output" in cfg.tied:
            generator.weight = tgt_embed.weight
        model = RNNSeq2Seq(encoder, decoder, generator, shape.pad_id, cfg.teacher_forcing)
        init_weights(model)
        return model
