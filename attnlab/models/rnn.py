"""The recurrent encoder-decoder the Transformer replaced: a (bidirectional) RNN encoder and an RNN
decoder with one fixed context vector (Sutskever et al. 2014, Cho et al. 2014), Bahdanau (additive)
attention or Luong attention with input feeding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import nn

from attnlab.config import flattened, one_of
from attnlab.errors import ConfigError
from attnlab.models.family import Capabilities, Depths, FamilyConfig, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig
from attnlab.models.transformer import SINGLE_STACK_TIES, init_weights
from attnlab.models.transformer_config import Positions
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

    # d_model, n_layers and dropout: a StackConfig's (N layers of width d_model), max_len: a Positions'
    # (scheme none: no position is added to a token; max_len, those of the location score), composed
    # flattened (config.flattened): written in the section (model.d_model), the parts' other fields kept
    # at defaults that no value of these refuses (one head), and no attention stack (models/stack.py)
    stack: StackConfig = flattened(
        StackConfig(d_model=512, n_heads=1, n_layers=6, dropout=0.1), ("d_model", "n_layers", "dropout")
    )
    depths: Depths = Depths()
    embedding_dropout: Optional[float] = None
    positions: Positions = flattened(Positions(scheme="none", max_len=1024), ("max_len",))
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
        p = self.embedding_dropout  # d_model, n_layers, dropout and max_len: their parts check them
        if p is not None and not 0.0 <= p < 1.0:
            raise ConfigError(f"embedding_dropout must be in [0, 1) (got {p})")
        if not 0.0 <= self.teacher_forcing <= 1.0:
            raise ConfigError(
                f"teacher_forcing is the probability that a training sequence reads the true "
                f"prefix: it must be in [0, 1] (got {self.teacher_forcing})"
            )

    @property
    def embed_dropout(self) -> float:
        return self.stack.dropout if self.embedding_dropout is None else self.embedding_dropout

    @property
    def longest_sequence(self) -> int:
        return self.positions.max_len

    @property
    def tied(self) -> tuple[str, ...]:
        return () if self.tie_embeddings == "none" else ("output",)

    @property
    def encoder_layers(self) -> int:
        return self.depths.encoder_layers(self.stack.n_layers)

    @property
    def decoder_layers(self) -> int:
        return self.depths.decoder_layers(self.stack.n_layers)


@register_family
class RNNFamily(ModelFamily):
    name = "rnn"
    config = RNNConfig
    capabilities = Capabilities(encoder=True, decoder=True, incremental_decoding=True, attention_weights=False)

    @staticmethod
    def build(cfg: RNNConfig, shape: DataShape) -> RNNSeq2Seq:
        cell, d_model, dropout = RNN_CELLS[cfg.rnn_cell], cfg.stack.d_model, cfg.stack.dropout
        vocab_size = shape.need("vocab_size", "arch 'rnn'")
        src_embed = nn.Embedding(shape.src_vocab or vocab_size, d_model)
        tgt_embed = nn.Embedding(vocab_size, d_model)
        carries = cfg.rnn_decoder == "lake_baroni"
        encoder = RNNEncoder(
            src_embed, cell, d_model, cfg.encoder_layers, cfg.bidirectional, dropout, cfg.embed_dropout, carries
        )
        score = None
        if cfg.rnn_attention != "none":
            score = SCORES[cfg.score](d_model, encoder.out_dim, d_attn=d_model, max_len=cfg.positions.max_len)
        decoder: LakeBaroniDecoder | RNNDecoder
        if carries:
            decoder = LakeBaroniDecoder(tgt_embed, cell, d_model, cfg.decoder_layers, score, dropout, cfg.embed_dropout)
        else:
            decoder = RNNDecoder(
                tgt_embed,
                cell,
                d_model,
                encoder.out_dim,
                cfg.decoder_layers,
                cfg.rnn_attention,
                score,
                cfg.input_feeding,
                dropout,
                cfg.embed_dropout,
            )
        generator = nn.Linear(d_model, vocab_size, bias=False)
        if "output" in cfg.tied:
            generator.weight = tgt_embed.weight
        model = RNNSeq2Seq(encoder, decoder, generator, shape.pad_id, cfg.teacher_forcing)
        init_weights(model)
        return model
