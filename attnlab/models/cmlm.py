"""The conditional masked language model of Mask-Predict (Ghazvininejad et al. 2019): the
encoder-decoder's parts with a decoder that is not causal, and a length predictor on the
encoder (nn/cmlm.py). Trained by data.task 'masked_translation', decoded by mask-predict
(decode/mask_predict.py)."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import at_least
from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.encoder_decoder import SEQ2SEQ_VOCABULARIES, seq2seq_parts
from attnlab.models.family import Capabilities, Depths, FamilyConfig, Inputs, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig
from attnlab.models.transformer_config import TWO_TABLE_TIES, Output, Positions, TokenEmbeddings, TransformerFamily
from attnlab.nn.backends import BackendOptions
from attnlab.nn.cmlm import ConditionalMaskedLM, LengthPredictor

MASKED_TOKENS = Inputs.MASKED_TOKENS  # what the model reads: a source, and a target with some tokens masked


@dataclass(frozen=True)
class CMLMConfig(FamilyConfig):
    """The encoder-decoder's parts (the Transformer fields, ``depths``, ``output``: models/encoder_decoder.py),
    plus ``max_target_length``, the lengths 1 .. max_target_length the length predictor chooses among
    (a longer training target counts as the longest), and ``length_loss_weight``, the length loss's
    weight in training (the paper's 0.1)."""

    stack: StackConfig = StackConfig()
    positions: Positions = Positions()
    embeddings: TokenEmbeddings = TokenEmbeddings()
    backends: BackendOptions = BackendOptions()

    depths: Depths = Depths()
    output: Output = Output()
    max_target_length: int = 256
    length_loss_weight: float = 0.1

    def check(self) -> None:
        super().check()
        self.output.check_vocabulary(SEQ2SEQ_VOCABULARIES)
        at_least("max_target_length", self.max_target_length, 1)
        if self.length_loss_weight < 0:
            raise ConfigError(f"length_loss_weight must be >= 0 (got {self.length_loss_weight})")
        if self.max_positions is not None and self.max_target_length > self.max_positions:
            raise ConfigError(
                f"max_target_length ({self.max_target_length}) must be within max_len "
                f"({self.max_positions}) of the learned positional table"
            )

    @property
    def encoder_layers(self) -> int:
        return self.depths.encoder_layers(self.stack.n_layers)

    @property
    def decoder_layers(self) -> int:
        return self.depths.decoder_layers(self.stack.n_layers)


@register_family
class CMLMFamily(TransformerFamily):
    name = "cmlm"
    config = CMLMConfig
    ties = TWO_TABLE_TIES
    capabilities = Capabilities(
        encoder=True, decoder=True, incremental_decoding=False, attention_weights=True, inputs=MASKED_TOKENS
    )

    @staticmethod
    def build(cfg: CMLMConfig, shape: DataShape) -> ConditionalMaskedLM:
        model = ConditionalMaskedLM(
            *seq2seq_parts(cfg, shape, causal=False),
            LengthPredictor(cfg.stack.d_model, cfg.max_target_length),
            shape.pad_id,
            cfg.length_loss_weight,
        )
        parts.init_weights(model)
        return model
