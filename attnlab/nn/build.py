"""build_model(cfg): the one place where config strings become modules.

Initialisation (the paper does not state one; this follows the Annotated Transformer and fairseq):
every weight matrix of a Linear layer is Xavier-uniform and every bias zero (the fused Q/K/V and
K/V projections block by block, each d_model x d_model, as if they were separate matrices); token embeddings are
N(0, 1/D_tok), so that after the sqrt(D_tok) scale a token vector has unit variance, like the
sinusoids it is added to; positional tables keep PyTorch's N(0, 1), the same scale; LayerNorm
starts at gain 1 and bias 0. A tied output projection shares the token embedding's initial value.
"""

from __future__ import annotations

from torch import nn

from attnlab.config import ModelConfig
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.feedforward import PositionWiseFeedForward
from attnlab.nn.layers import DecoderLayer, EncoderLayer
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.backends import AttentionBackend
from attnlab.nn.registry import ACTIVATIONS, ATTENTION_BACKENDS, POSITIONAL, RNN_CELLS, SCORES
from attnlab.nn.residual import ResidualConnection
from attnlab.nn.rnn import RNNDecoder, RNNEncoder, RNNSeq2Seq
from attnlab.nn.transformer import (
    ClassificationHead,
    Decoder,
    DecoderLM,
    Embeddings,
    Encoder,
    EncoderDecoder,
    EncoderOnly,
    MaskedLMHead,
)


def build_model(cfg: ModelConfig) -> nn.Module:
    """A freshly initialised EncoderDecoder, DecoderLM or EncoderOnly, as ``cfg.arch`` says."""
    if cfg.arch == "encoder_decoder":
        src_embed = _embeddings(cfg, cfg.src_vocab)
        tgt_embed = _embeddings(cfg, cfg.vocab_size)
        if "src_tgt" in cfg.tied:
            tgt_embed.tokens = src_embed.tokens
        model: nn.Module = EncoderDecoder(src_embed, tgt_embed, _encoder(cfg), _decoder(cfg, cross=True),
                                          _output_projection(cfg, tgt_embed), cfg.pad_id)
    elif cfg.arch == "rnn":
        model = _rnn(cfg)
    elif cfg.arch == "decoder_lm":
        embed = _embeddings(cfg, cfg.vocab_size)
        model = DecoderLM(embed, _decoder(cfg, cross=False), _output_projection(cfg, embed), cfg.pad_id)
    else:
        embed = _embeddings(cfg, cfg.vocab_size)
        mlm_head = MaskedLMHead(cfg.d_model, ACTIVATIONS[cfg.activation](), cfg.layer_norm_eps,
                                _output_projection(cfg, embed))
        model = EncoderOnly(embed, _encoder(cfg), mlm_head, ClassificationHead(cfg.d_model, cfg.n_classes, cfg.dropout),
                            cfg.pad_id)
    _init_weights(model)
    return model


def _rnn(cfg: ModelConfig) -> RNNSeq2Seq:
    """A recurrent encoder-decoder; embeddings are d_model wide and tied as configured."""
    cell = RNN_CELLS[cfg.rnn_cell]
    src_embed = nn.Embedding(cfg.src_vocab, cfg.d_model)
    tgt_embed = src_embed if "src_tgt" in cfg.tied else nn.Embedding(cfg.vocab_size, cfg.d_model)
    encoder = RNNEncoder(src_embed, cell, cfg.d_model, cfg.encoder_layers, cfg.bidirectional, cfg.dropout)
    score = None
    if cfg.rnn_attention != "none":
        score = SCORES[cfg.score](cfg.d_model, encoder.out_dim, d_attn=cfg.d_model, max_len=cfg.max_len)
    decoder = RNNDecoder(tgt_embed, cell, cfg.d_model, encoder.out_dim, cfg.decoder_layers, cfg.rnn_attention,
                         score, cfg.input_feeding, cfg.dropout)
    generator = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
    if "output" in cfg.tied:
        generator.weight = tgt_embed.weight
    return RNNSeq2Seq(encoder, decoder, generator, cfg.pad_id)


def _positional(cfg: ModelConfig, where: str) -> PositionalEncoding:
    """The configured scheme where it belongs ('embeddings' or 'self_attention'); identity elsewhere."""
    cls = POSITIONAL[cfg.positional]
    belongs = "embeddings" if cls.absolute else "self_attention"
    return cls.from_config(cfg) if where == belongs else PositionalEncoding()


def _embeddings(cfg: ModelConfig, vocab_size: int) -> Embeddings:
    return Embeddings(vocab_size, cfg.token_width, _positional(cfg, "embeddings"), cfg.dropout)


def _backend(cfg: ModelConfig, cross: bool) -> AttentionBackend:
    """The ``attention_backend`` with its own fields. Windows and sparse patterns are about positions
    within one sequence; cross-attention (target over source) takes exact ``chunked`` attention."""
    name = cfg.attention_backend
    if cross and name in ("local", "sparse"):
        name = "chunked"
    return ATTENTION_BACKENDS[name].from_config(cfg)


def _attention(cfg: ModelConfig, cross: bool = False) -> MultiHeadAttention:
    positional = PositionalEncoding() if cross else _positional(cfg, "self_attention")
    return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, cross=cross, positional=positional,
                              backend=_backend(cfg, cross))


def _feed_forward(cfg: ModelConfig) -> PositionWiseFeedForward:
    return PositionWiseFeedForward(cfg.d_model, cfg.d_ff, ACTIVATIONS[cfg.activation]())


def _residual(cfg: ModelConfig) -> ResidualConnection:
    return ResidualConnection(cfg.d_model, cfg.dropout, cfg.norm, cfg.layer_norm_eps)


def _final_norm(cfg: ModelConfig) -> nn.Module:
    """Pre-norm stacks leave their output unnormalised, so they end with a LayerNorm."""
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm == "pre" else nn.Identity()


def _encoder(cfg: ModelConfig) -> Encoder:
    layers = [EncoderLayer(_attention(cfg), _feed_forward(cfg), _residual(cfg), _residual(cfg))
              for _ in range(cfg.encoder_layers)]
    return Encoder(layers, _final_norm(cfg))


def _decoder(cfg: ModelConfig, cross: bool) -> Decoder:
    layers = [DecoderLayer(_attention(cfg), _attention(cfg, cross=True) if cross else None, _feed_forward(cfg),
                           _residual(cfg), _residual(cfg) if cross else None, _residual(cfg))
              for _ in range(cfg.decoder_layers)]
    return Decoder(layers, _final_norm(cfg))


def _output_projection(cfg: ModelConfig, embed: Embeddings) -> nn.Linear:
    """Pre-softmax linear map d_model -> V, without bias; tied to the token embedding when configured."""
    projection = nn.Linear(cfg.d_model, embed.tokens.num_embeddings, bias=False)
    if "output" in cfg.tied:
        projection.weight = embed.tokens.weight
    return projection


def _init_weights(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            fused = module.kv_proj if module.cross else module.qkv_proj
            for block in fused.weight.data.split(module.out_proj.in_features):  # one d_model x d_model each
                nn.init.xavier_uniform_(block)
    for module in model.modules():  # after the Linears, so that tied projections end with this value
        if isinstance(module, Embeddings):
            nn.init.normal_(module.tokens.weight, std=module.tokens.embedding_dim ** -0.5)
