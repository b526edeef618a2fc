"""attnlab.nn: model math only (no files, optimisers, logging or command line)."""

from attnlab.nn.attention import CrossAttention, MultiHeadAttention, SelfAttention
from attnlab.nn.cache import DecoderCache, KVCache
from attnlab.nn.decoder_lm import DecoderLM
from attnlab.nn.embeddings import Embeddings
from attnlab.nn.encoder_decoder import EncoderDecoder
from attnlab.nn.encoder_only import EncoderOnly
from attnlab.nn.feedforward import PositionWiseFeedForward
from attnlab.nn.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    ResidualConnection,
    Seq2SeqDecoder,
    Seq2SeqDecoderLayer,
)
from attnlab.nn.masks import causal_mask, padding_mask
from attnlab.nn.positional import PositionalEncoding, sinusoid

__all__ = [
    "MultiHeadAttention",
    "SelfAttention",
    "CrossAttention",
    "KVCache",
    "DecoderCache",
    "PositionWiseFeedForward",
    "ResidualConnection",
    "EncoderLayer",
    "DecoderLayer",
    "Seq2SeqDecoderLayer",
    "causal_mask",
    "padding_mask",
    "PositionalEncoding",
    "sinusoid",
    "Embeddings",
    "Encoder",
    "Decoder",
    "Seq2SeqDecoder",
    "EncoderDecoder",
    "DecoderLM",
    "EncoderOnly",
]
