"""Every string a config can name, mapped to what it means. Unknown names are rejected by
attnlab.config with the list of valid ones; nn/build.py is the only place they are resolved."""

from __future__ import annotations

from torch import nn

from attnlab.nn.backends import (
    AttentionBackend,
    ChunkedBackend,
    LinearBackend,
    LocalBackend,
    SDPABackend,
    SparseBackend,
)
from attnlab.nn.scores import (
    AdditiveScore,
    AlignmentScore,
    CosineScore,
    DotScore,
    GeneralScore,
    LocationScore,
    ScaledDotScore,
)
from attnlab.nn.positional import (
    ALiBiPositional,
    LearnedPositional,
    PositionalEncoding,
    RelativeBias,
    RelativePositional,
    RotaryPositional,
    SinusoidalPositional,
)

ARCHS = ("encoder_decoder", "decoder_lm", "encoder_only", "rnn")

ATTENTION_BACKENDS: dict[str, type[AttentionBackend]] = {
    "math": AttentionBackend,
    "sdpa": SDPABackend,
    "chunked": ChunkedBackend,
    "local": LocalBackend,
    "sparse": SparseBackend,
    "linear": LinearBackend,
}

POSITIONAL: dict[str, type[PositionalEncoding]] = {
    "sinusoidal": SinusoidalPositional,
    "learned": LearnedPositional,
    "relative": RelativePositional,
    "relative_bias": RelativeBias,
    "rotary": RotaryPositional,
    "alibi": ALiBiPositional,
    "none": PositionalEncoding,
}

POSITIONAL_COMBINE = ("add", "concat")

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}

NORM_PLACEMENTS = ("post", "pre")

TIE_EMBEDDINGS = ("none", "output", "src_tgt", "all")

SCORES: dict[str, type[AlignmentScore]] = {
    "dot": DotScore,
    "scaled_dot": ScaledDotScore,
    "general": GeneralScore,
    "additive": AdditiveScore,
    "cosine": CosineScore,
    "location": LocationScore,
}

RNN_CELLS: dict[str, type[nn.RNNBase]] = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}

RNN_ATTENTION = ("none", "bahdanau", "luong")
