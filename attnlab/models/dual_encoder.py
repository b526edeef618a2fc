"""The CLIP-style dual encoder (``arch: dual_encoder``): the ViT's image encoder (patches, positions
on the patch grid, the pre-norm encoder, a class token or the patch mean) and the Transformer's
encoder over the text (token embeddings with the Transformer's positions), each summarised,
projected without bias to ``d_embed`` and normalised (nn/dual_encoder.py).

One config for both towers: they share d_model, n_heads, d_ff, the dropouts, activation, norm
placement and backend (ViT's exact ones), each with its own depth (``n_image_layers``,
``n_text_layers``; default ``n_layers``). ``patches`` (size and positional scheme) place the patches (ViT's
schemes), ``positions`` the text's tokens (the Transformer's). ``init_temperature``: CLIP's tau
= 0.07, learned as log(1 / tau); ``max_logit_scale``: CLIP's bound 100 on 1 / tau.
Initialisation: the Transformer's (models/transformer.py: the projections Xavier-uniform), the
patch position tables as ViT's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from attnlab.config import at_least, one_of
from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, FamilyConfig, Inputs, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig, fields_free_exact
from attnlab.models.transformer_config import Positions, TokenEmbeddings, TransformerFamily
from attnlab.models.vit import (
    IMAGE_BACKENDS_REFUSAL,
    SUMMARIES,
    Patches,
    init_patch_positions,
)
from attnlab.nn.backends import BackendOptions
from attnlab.nn.dual_encoder import DualEncoder, ImageTower, TextTower
from attnlab.nn.registry import POOLINGS


@dataclass(frozen=True)
class DualEncoderConfig(FamilyConfig):
    """The patch size P, where the patches sit (``patches.positional``), each tower's summary (``image_pooling``: ``cls``,
    ViT's class token, or ``mean`` of the patches; ``text_pooling``: ``cls``, the first token, a
    BOS, or ``mean`` of the tokens), the joint space's width ``d_embed``, the temperature's start
    and bound, and the Transformer's fields for the two stacks: small, pre-norm and GELU by
    default, as ViT. There is no output layer to tie the token table to (``embeddings.tie: none``)."""

    stack: StackConfig = StackConfig(d_model=128, n_heads=4, n_layers=3, d_ff=512, activation="gelu", norm="pre")
    positions: Positions = Positions(max_len=64)
    embeddings: TokenEmbeddings = TokenEmbeddings(tie="none")
    backends: BackendOptions = BackendOptions()

    patches: Patches = Patches(size=4, positional="learned_2d")
    n_image_layers: Optional[int] = None
    n_text_layers: Optional[int] = None
    image_pooling: str = "cls"
    text_pooling: str = "cls"
    d_embed: int = 64
    init_temperature: float = 0.07
    max_logit_scale: float = 100.0

    def check(self) -> None:
        one_of("image_pooling", self.image_pooling, SUMMARIES)
        one_of("text_pooling", self.text_pooling, POOLINGS)
        for name in ("n_image_layers", "n_text_layers"):
            if getattr(self, name) is not None:
                at_least(name, getattr(self, name), 1)
        at_least("d_embed", self.d_embed, 1)
        if not 0 < self.init_temperature:
            raise ConfigError(f"init_temperature must be > 0 (got {self.init_temperature})")
        if self.max_logit_scale < 1 / self.init_temperature:
            raise ConfigError(
                f"max_logit_scale ({self.max_logit_scale}) must be at least 1 / init_temperature "
                f"({1 / self.init_temperature:.4g})"
            )
        super().check()
        self.patches.check_width(self.stack.d_model)

    def check_shape(self, shape: DataShape) -> None:
        self.patches.check_image(shape)

    @property
    def image_layers(self) -> int:
        return self.n_image_layers if self.n_image_layers is not None else self.stack.n_layers

    @property
    def text_layers(self) -> int:
        return self.n_text_layers if self.n_text_layers is not None else self.stack.n_layers


@register_family
class DualEncoderFamily(TransformerFamily):
    name = "dual_encoder"
    config = DualEncoderConfig
    ties = ("none",)
    # encoder/decoder mean a source sequence read for a decoder, and tokens written: neither here
    capabilities = Capabilities(
        encoder=False, decoder=False, incremental_decoding=False, attention_weights=True, inputs=Inputs.IMAGE_TEXT
    )
    backends_fit = fields_free_exact  # a function read from the class: no self
    backends_refusal = IMAGE_BACKENDS_REFUSAL

    @staticmethod
    def build(cfg: DualEncoderConfig, shape: DataShape) -> DualEncoder:
        d_model, of = cfg.stack.d_model, "arch 'dual_encoder'"
        image = ImageTower(
            cfg.patches.embedding(shape, d_model, of),
            cfg.patches.positions(shape, d_model, of),
            SUMMARIES[cfg.image_pooling](cfg.stack.d_model),
            parts.plain_encoder(cfg, cfg.image_layers),
        )
        text = TextTower(
            parts.embeddings(cfg, shape.need("vocab_size", "arch 'dual_encoder'")),
            parts.encoder(cfg, cfg.text_layers),
            POOLINGS[cfg.text_pooling](),
            shape.pad_id,
        )
        model = DualEncoder(image, text, cfg.stack.d_model, cfg.d_embed, cfg.init_temperature, cfg.max_logit_scale)
        parts.init_weights(model)
        init_patch_positions(model.image.positional)
        return model
