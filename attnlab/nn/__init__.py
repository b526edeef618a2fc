"""attnlab.nn: model math only (no files, optimisers, logging or command line)."""

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.backends import attention
from attnlab.nn.cache import DecoderCache, KVCache
from attnlab.nn.feedforward import PositionWiseFeedForward
from attnlab.nn.layers import DecoderLayer, EncoderLayer
from attnlab.nn.masks import causal_mask, padding_mask
from attnlab.nn.positional import PositionalEncoding, sinusoid
from attnlab.nn.residual import ResidualConnection
from attnlab.nn.transformer import Decoder, DecoderLM, Embeddings, Encoder, EncoderDecoder, EncoderOnly

__all__ = [
    "attention", "MultiHeadAttention", "KVCache", "DecoderCache", "PositionWiseFeedForward", "ResidualConnection",
    "EncoderLayer", "DecoderLayer", "causal_mask", "padding_mask", "PositionalEncoding", "sinusoid",
    "Embeddings", "Encoder", "Decoder", "EncoderDecoder", "DecoderLM", "EncoderOnly",
]
