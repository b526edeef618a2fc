"""The Transformer family's modules under their former import path, ``attnlab.nn.transformer``.

Each now lives in a module named for it: nn/embeddings.py, nn/layers.py (the encoder and decoder
stacks), nn/encoder_decoder.py, nn/decoder_lm.py, nn/encoder_only.py, nn/heads.py, nn/pooling.py.
Import them from there; this module only re-exports them for code written before the split.
"""

from attnlab.nn.decoder_lm import DecoderLM
from attnlab.nn.embeddings import Embeddings
from attnlab.nn.encoder_decoder import EncoderDecoder, Seq2Seq, TransformerTargetSide
from attnlab.nn.encoder_only import EncoderOnly
from attnlab.nn.heads import ClassificationHead, MaskedLMHead, MultiTokenHead, VocabularyProjection
from attnlab.nn.layers import Decoder, Encoder, LayerStack, Seq2SeqDecoder
from attnlab.nn.pooling import FirstTokenPooling, MeanPooling

__all__ = [
    "ClassificationHead",
    "Decoder",
    "DecoderLM",
    "Embeddings",
    "Encoder",
    "EncoderDecoder",
    "EncoderOnly",
    "FirstTokenPooling",
    "LayerStack",
    "MaskedLMHead",
    "MeanPooling",
    "MultiTokenHead",
    "Seq2Seq",
    "Seq2SeqDecoder",
    "TransformerTargetSide",
    "VocabularyProjection",
]
