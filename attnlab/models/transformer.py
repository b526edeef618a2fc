"""What the three Transformer families share: the builders that turn the config of the blocks
(models/transformer_config.py: attention, positions, feed-forward, residual and norm) into modules.

Initialisation (the paper does not state one; this follows the Annotated Transformer and fairseq):
every weight matrix of a Linear layer is Xavier-uniform and every bias zero (the fused Q/K/V and
K/V projections block by block, each d_model x d_model, as if they were separate matrices); token embeddings are
N(0, 1/D_tok), so that after the sqrt(D_tok) scale a token vector has unit variance, like the
sinusoids it is added to; positional tables keep PyTorch's N(0, 1), the same scale; LayerNorm
starts at gain 1 and bias 0. A tied output projection shares the token embedding's initial value.
"""

from __future__ import annotations

from typing import Literal, Protocol, overload

import torch
from torch import nn

from attnlab.models.stack import StackConfig
from attnlab.models.transformer_config import EMBEDDINGS, SINGLE_STACK_TIES, TransformerConfig
from attnlab.nn.attention import CrossAttention, MultiHeadAttention, SelfAttention
from attnlab.nn.backends import AttentionBackend
from attnlab.nn.embeddings import Embeddings
from attnlab.nn.feedforward import PositionWiseFeedForward
from attnlab.nn.heads import VocabularyProjection
from attnlab.nn.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    NoResidual,
    ResidualConnection,
    Seq2SeqDecoder,
    Seq2SeqDecoderLayer,
)
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.registry import ACTIVATIONS, ATTENTION_BACKENDS, ATTENTION_SCALES, NORMALISATIONS, POSITIONAL

# The config's Protocol, importable from here as before the split
__all__ = ["EMBEDDINGS", "SINGLE_STACK_TIES", "TransformerConfig"]


class Stacked(Protocol):
    """What the builders of blocks read of a family's config: its attention stack (the config of any
    family with one, a Transformer family's or ViT's, graph's, PatchTST's, ...)."""

    @property
    def stack(self) -> StackConfig: ...


# -- the parts, built from a TransformerConfig ---------------------------------------------------


def positional(cfg: TransformerConfig, where: str) -> PositionalEncoding:
    """The configured scheme where it belongs ('embeddings' or 'self_attention'); identity elsewhere.
    (Patches are placed by their own part, ``patches.positional``: models/vit.py.)"""
    cls = POSITIONAL[cfg.positions.scheme]
    belongs = "embeddings" if cls.absolute else "self_attention"
    return cls.from_config(cfg) if where == belongs else PositionalEncoding()


def embeddings(cfg: TransformerConfig, vocab_size: int, n_segments: int = 0) -> Embeddings:
    """Token embeddings with the absolute positions, and a segment table of ``n_segments`` rows."""
    segments = nn.Embedding(n_segments, cfg.stack.d_model) if n_segments else None
    rows = padded_vocabulary(cfg, vocab_size)
    if cfg.embeddings.kind == "normed":
        return Embeddings(
            rows,
            cfg.positions.token_width(cfg.stack.d_model),
            positional(cfg, "embeddings"),
            cfg.stack.dropout,
            segments,
            scale=1.0,
            norm=nn.LayerNorm(cfg.stack.d_model, eps=cfg.stack.layer_norm_eps),
        )
    scale = 1.0 if cfg.embeddings.kind == "plain" else None  # None: the paper's sqrt(D_tok)
    return Embeddings(
        rows,
        cfg.positions.token_width(cfg.stack.d_model),
        positional(cfg, "embeddings"),
        cfg.stack.dropout,
        segments,
        scale=scale,
    )


def backend(cfg: Stacked, cross: bool) -> AttentionBackend:
    """The ``attention_backend`` with its own fields; cross-attention takes the backend it declares
    for it (a window over positions of one sequence means nothing from target to source)."""
    chosen = ATTENTION_BACKENDS[cfg.stack.attention_backend]
    if cross and chosen.cross_attention is not None:
        chosen = ATTENTION_BACKENDS[chosen.cross_attention]
    return chosen.from_config(cfg)


@overload
def attention(cfg: TransformerConfig, cross: Literal[False] = False) -> SelfAttention: ...
@overload
def attention(cfg: TransformerConfig, cross: Literal[True]) -> CrossAttention: ...
@overload
def attention(cfg: TransformerConfig, cross: bool) -> MultiHeadAttention: ...


def attention(cfg: TransformerConfig, cross: bool = False) -> MultiHeadAttention:
    """Self-attention with the configured positions inside it, or (``cross``) cross-attention."""
    if cross:
        return CrossAttention(
            cfg.stack.d_model,
            cfg.stack.n_heads,
            cfg.stack.attn_dropout,
            backend=backend(cfg, cross=True),
            scale=ATTENTION_SCALES[cfg.stack.attention_scale](cfg.stack.d_head),
        )
    scheme = positional(cfg, "self_attention")
    return SelfAttention(
        cfg.stack.d_model,
        cfg.stack.n_heads,
        cfg.stack.attn_dropout,
        positional=scheme,
        backend=backend(cfg, cross=False),
        scale=ATTENTION_SCALES[cfg.stack.attention_scale](cfg.stack.d_head),
    )


def feed_forward(cfg: Stacked) -> tuple[PositionWiseFeedForward | None, ResidualConnection | None]:
    """A layer's FFN sublayer and its residual block; (None, None) in the ablation without FFNs."""
    if not cfg.stack.ffn:
        return None, None
    return PositionWiseFeedForward(cfg.stack.d_model, cfg.stack.d_ff, ACTIVATIONS[cfg.stack.activation]()), residual(
        cfg
    )


def residual(cfg: Stacked) -> ResidualConnection:
    """A residual block, or the ablation without the residual sum (``residual: false``)."""
    block = ResidualConnection if cfg.stack.residual else NoResidual
    return block(
        cfg.stack.d_model,
        cfg.stack.dropout,
        cfg.stack.norm,
        cfg.stack.layer_norm_eps,
        NORMALISATIONS[cfg.stack.normalisation],
    )


def final_norm(cfg: Stacked) -> nn.Module:
    """Pre-norm stacks leave their output unnormalised, so they end with a norm."""
    return (
        NORMALISATIONS[cfg.stack.normalisation](cfg.stack.d_model, eps=cfg.stack.layer_norm_eps)
        if cfg.stack.norm == "pre"
        else nn.Identity()
    )


def encoder_layer(cfg: Stacked, self_attn: SelfAttention) -> EncoderLayer:
    feed_forward_sublayer, feed_forward_residual = feed_forward(cfg)
    return EncoderLayer(self_attn, feed_forward_sublayer, residual(cfg), feed_forward_residual)


def encoder(cfg: TransformerConfig, n_layers: int) -> Encoder:
    return Encoder([encoder_layer(cfg, attention(cfg)) for _ in range(n_layers)], final_norm(cfg))


def plain_encoder(cfg: Stacked, n_layers: int) -> Encoder:
    """The Transformer's encoder layers (feed-forward, residual blocks and norms from the same part
    builders) whose self-attention has no positional hooks, for a family with no ``positions``
    field: its inputs have no sequence positions (a graph's nodes, placed by their Laplacian
    eigenvectors), or theirs enter with them at the input (PatchTST's learned patch positions)."""

    def self_attention() -> SelfAttention:
        return SelfAttention(
            cfg.stack.d_model,
            cfg.stack.n_heads,
            cfg.stack.attn_dropout,
            backend=backend(cfg, cross=False),
            scale=ATTENTION_SCALES[cfg.stack.attention_scale](cfg.stack.d_head),
        )

    return Encoder([encoder_layer(cfg, self_attention()) for _ in range(n_layers)], final_norm(cfg))


def decoder_layer(cfg: TransformerConfig, cross: bool) -> DecoderLayer:
    """The decoder-only block, or (``cross``) the encoder-decoder's layer with cross-attention."""
    self_attn, cross_attn = attention(cfg), attention(cfg, cross=True) if cross else None
    feed_forward_sublayer, feed_forward_residual = feed_forward(cfg)
    if cross_attn is None:
        return DecoderLayer(self_attn, feed_forward_sublayer, residual(cfg), feed_forward_residual)
    return Seq2SeqDecoderLayer(
        self_attn, cross_attn, feed_forward_sublayer, residual(cfg), residual(cfg), feed_forward_residual
    )


@overload
def decoder(cfg: TransformerConfig, n_layers: int, cross: Literal[True], causal: bool = True) -> Seq2SeqDecoder: ...
@overload
def decoder(cfg: TransformerConfig, n_layers: int, cross: bool, causal: bool = True) -> Decoder: ...


def decoder(cfg: TransformerConfig, n_layers: int, cross: bool, causal: bool = True) -> Decoder:
    """The decoder-only stack, or (``cross``) the encoder-decoder's (``causal=False``: CMLM's)."""
    stack: type[Decoder] = Seq2SeqDecoder if cross else Decoder  # with cross, the layers are Seq2SeqDecoderLayers
    return stack([decoder_layer(cfg, cross) for _ in range(n_layers)], final_norm(cfg), causal)


def padded_vocabulary(cfg: TransformerConfig, vocab_size: int) -> int:
    """The rows of a token table and of the output projection: ``vocab_size`` rounded up to a
    multiple of ``embeddings.vocab_multiple`` (64 suits a GPU's matrix products; 1, the default, pads nothing)."""
    return cfg.embeddings.rows(vocab_size)


def output_projection(
    cfg: TransformerConfig, embed: Embeddings, vocab_size: int, never: tuple[int, ...] = (), bias: bool = False
) -> VocabularyProjection:
    """Pre-softmax linear map d_model -> V (the target vocabulary, ``vocab_size``), with a bias per
    token only if asked, over the token table's rows (padded: :func:`padded_vocabulary`); tied to the
    token embedding when configured. ``never``: token ids whose logits are -inf."""
    projection = VocabularyProjection(cfg.stack.d_model, embed.tokens.num_embeddings, vocab_size, never, bias)
    if "output" in cfg.tied:
        projection.weight = embed.tokens.weight
    return projection


def init_weights(model: nn.Module) -> None:
    """The initialisation of the module docstring, for a model of any family."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            for block in torch.split(
                module.fused_projection.weight.data, module.out_proj.in_features
            ):  # one d_model x d_model each
                nn.init.xavier_uniform_(block)
    for module in model.modules():  # after the Linears, so that tied projections end with this value
        if isinstance(module, Embeddings):
            nn.init.normal_(module.tokens.weight, std=module.tokens.embedding_dim**-0.5)
