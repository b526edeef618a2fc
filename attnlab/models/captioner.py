"""The image captioner (``arch: captioner``): the ViT's patch encoder (nn/vision.py: patches, a
linear patch embedding, positions on the patch grid, the pre-norm encoder; no class token: every
patch state is a key) and the Transformer's decoder, whose cross-attention reads the patch states.

One config for both sides: the encoder and the decoder share d_model, n_heads, d_ff, the dropouts,
activation, norm placement and backend (ViT's exact ones), each with its own depth
(``depths``: ``encoder``, ``decoder``; default ``n_layers``). ``patches`` (size and positional scheme) place
the patches (ViT's schemes, models/vit.py); ``positions`` places the caption's tokens (the
Transformer's schemes). Initialisation: the Transformer's (models/transformer.py), the patch
position tables as ViT's.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, Depths, FamilyConfig, Inputs, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig, fields_free_exact
from attnlab.models.transformer_config import Positions, TokenEmbeddings, TransformerFamily
from attnlab.models.vit import IMAGE_BACKENDS_REFUSAL, Patches, init_patch_positions
from attnlab.nn.backends import BackendOptions
from attnlab.nn.captioner import ImageCaptioner


@dataclass(frozen=True)
class CaptionerConfig(FamilyConfig):
    """The patch size P (dividing both sides of the data's images), where the patches sit
    (``patches.positional``), and the Transformer's fields for the two stacks: small, pre-norm and
    GELU by default, as ViT."""

    stack: StackConfig = StackConfig(d_model=128, n_heads=4, n_layers=3, d_ff=512, activation="gelu", norm="pre")
    positions: Positions = Positions(max_len=64)
    embeddings: TokenEmbeddings = TokenEmbeddings(tie="output")
    backends: BackendOptions = BackendOptions()

    patches: Patches = Patches(size=4, positional="learned_2d")
    depths: Depths = Depths()

    def check(self) -> None:
        super().check()
        self.patches.check_width(self.stack.d_model)

    def check_shape(self, shape: DataShape) -> None:
        self.patches.check_image(shape)

    @property
    def encoder_layers(self) -> int:
        return self.depths.encoder_layers(self.stack.n_layers)

    @property
    def decoder_layers(self) -> int:
        return self.depths.decoder_layers(self.stack.n_layers)


@register_family
class CaptionerFamily(TransformerFamily):
    name = "captioner"
    config = CaptionerConfig
    capabilities = Capabilities(
        encoder=True, decoder=True, incremental_decoding=True, attention_weights=True, inputs=Inputs.IMAGES
    )
    backends_fit = fields_free_exact  # a function read from the class: no self
    backends_refusal = IMAGE_BACKENDS_REFUSAL

    @staticmethod
    def build(cfg: CaptionerConfig, shape: DataShape) -> ImageCaptioner:
        vocab_size = shape.need("vocab_size", "arch 'captioner'")
        tgt_embed = parts.embeddings(cfg, vocab_size)
        d_model, of = cfg.stack.d_model, "arch 'captioner'"
        model = ImageCaptioner(
            cfg.patches.embedding(shape, d_model, of),
            cfg.patches.positions(shape, d_model, of),
            parts.plain_encoder(cfg, cfg.encoder_layers),
            tgt_embed,
            parts.decoder(cfg, cfg.decoder_layers, cross=True),
            parts.output_projection(cfg, tgt_embed, vocab_size),
            shape.pad_id,
        )
        parts.init_weights(model)
        init_patch_positions(model.positional)
        return model
