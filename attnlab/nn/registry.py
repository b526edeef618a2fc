"""Every string a model config can name, mapped to what it means. The families' configs
(attnlab/models) reject unknown names with the list of valid ones, and their builders resolve them."""

from __future__ import annotations

from torch import nn

from attnlab.nn.backends import BACKENDS, AttentionBackend
from attnlab.nn.layers import NoNorm, TokenBatchNorm
from attnlab.nn.pooling import FirstTokenPooling, FirstTwoPooling, MeanPooling
from attnlab.nn.positional import (
    ALiBiPositional,
    HalvesSinusoidalPositional,
    LearnedPositional,
    PositionalEncoding,
    RelativeBias,
    RelativePositional,
    RotaryPositional,
    SinusoidalPositional,
)
from attnlab.nn.scores import (
    AdditiveScore,
    AlignmentScore,
    CosineScore,
    DotScore,
    GeneralScore,
    LearnedScale,
    LocationScore,
    NoScale,
    PaperScale,
    ScaledDotScore,
)

ATTENTION_BACKENDS: dict[str, type[AttentionBackend]] = BACKENDS  # each backend registers itself (nn/backends/)

POSITIONAL: dict[str, type[PositionalEncoding]] = {
    "sinusoidal": SinusoidalPositional,
    "sinusoidal_halves": HalvesSinusoidalPositional,  # Marian's layout
    "learned": LearnedPositional,
    "relative": RelativePositional,
    "relative_bias": RelativeBias,
    "rotary": RotaryPositional,
    "alibi": ALiBiPositional,
    "none": PositionalEncoding,
}

POSITIONAL_COMBINE = ("add", "concat")


class TanhGELU(nn.GELU):
    """GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))): GPT-2's activation
    (Hugging Face's ``gelu_new``)."""

    def __init__(self) -> None:
        super().__init__(approximate="tanh")


ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "gelu_tanh": TanhGELU, "silu": nn.SiLU}

NORM_PLACEMENTS = ("post", "pre")

NORMALISATIONS: dict[str, type[nn.Module]] = {"layer": nn.LayerNorm, "batch": TokenBatchNorm, "none": NoNorm}

ATTENTION_SCALES: dict[str, type[nn.Module]] = {"sqrt_dk": PaperScale, "none": NoScale, "learned": LearnedScale}

POOLINGS: dict[str, type[nn.Module]] = {
    "cls": FirstTokenPooling,
    "distilled": FirstTwoPooling,
    "mean": MeanPooling,
}  # a sequence -> one vector

SCORES: dict[str, type[AlignmentScore]] = {
    "dot": DotScore,
    "scaled_dot": ScaledDotScore,
    "general": GeneralScore,
    "additive": AdditiveScore,
    "cosine": CosineScore,
    "location": LocationScore,
}

RNN_CELLS: dict[str, type[nn.RNN] | type[nn.LSTM] | type[nn.GRU]] = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}

RNN_ATTENTION = ("none", "bahdanau", "luong")
