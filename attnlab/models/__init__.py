"""Model families. Each is one module that declares its config (only its own fields), its builder
and its capabilities, and registers itself (models/family.py); ``model.arch`` selects one.
Adding a family is one new module here, which the package imports when it is imported (or, from outside the package, any module
that calls ``register_family`` before the config is read)."""

import importlib
import pkgutil

from attnlab.models.family import (
    FAMILIES,
    INPUT_KINDS,
    Capabilities,
    FamilyConfig,
    InputKind,
    Inputs,
    ModelFamily,
    build_model,
    family_named,
    input_kind,
    model_config,
    read_model_config,
    register_family,
)
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig, stack_of

# isort: off
# The built-in families register themselves on import, in the order error messages list them.
from attnlab.models.encoder_decoder import EncoderDecoderConfig
from attnlab.models.decoder_lm import DecoderLMConfig
from attnlab.models.encoder_only import EncoderOnlyConfig
from attnlab.models.rnn import RNNConfig
from attnlab.models.convs2s import ConvS2SConfig
from attnlab.models.transformer_xl import TransformerXLConfig
from attnlab.models.cmlm import CMLMConfig
from attnlab.models.graph import GraphConfig
from attnlab.models.vit import ViTConfig
from attnlab.models.captioner import CaptionerConfig
from attnlab.models.dual_encoder import DualEncoderConfig
from attnlab.models.single_stream import SingleStreamConfig
from attnlab.models.cnn import CNNConfig
from attnlab.models.patchtst import PatchTSTConfig
from attnlab.models.dlinear import DLinearConfig
from attnlab.models.last_value import LastValueConfig
# isort: on

for _module in pkgutil.iter_modules(__path__):  # a family not named above registers itself too
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "FAMILIES",
    "INPUT_KINDS",
    "Capabilities",
    "InputKind",
    "Inputs",
    "input_kind",
    "FamilyConfig",
    "ModelFamily",
    "build_model",
    "DataShape",
    "family_named",
    "model_config",
    "read_model_config",
    "register_family",
    "StackConfig",
    "stack_of",
    "EncoderDecoderConfig",
    "CMLMConfig",
    "DecoderLMConfig",
    "EncoderOnlyConfig",
    "RNNConfig",
    "ConvS2SConfig",
    "TransformerXLConfig",
    "GraphConfig",
    "ViTConfig",
    "CaptionerConfig",
    "DualEncoderConfig",
    "SingleStreamConfig",
    "CNNConfig",
    "PatchTSTConfig",
    "DLinearConfig",
    "LastValueConfig",
]
