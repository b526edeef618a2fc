"""The image captioner (``arch: captioner``): the ViT's patch encoder (nn/vision.py: patches, a
linear patch embedding, positions on the patch grid, the pre-norm encoder; no class token: every
patch state is a key) and the Transformer's decoder, whose cross-attention reads the patch states.

One config for both sides: the encoder and the decoder share d_model, n_heads, d_ff, the dropouts,
activation, norm placement and backend (ViT's exact ones), each with its own depth
(``depths``: ``encoder``, ``decoder``; default ``n_layers``). ``patches`` (size and positional scheme) place
the patches (ViT's schemes, models/vit.py); ``positional`` places the caption's tokens (the
Transformer's schemes). Initialisation: the Transformer's (models/transformer.py), the patch
position tables as ViT's.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, Depths, Inputs, ModelFamily, TwoSidedSizes, register_family
from attnlab.models.stack import StackConfig, fields_free_exact
from attnlab.models.transformer import TransformerConfig
from attnlab.models.vit import IMAGE_BACKENDS_REFUSAL, PATCH_POSITIONAL, Patches, PatchGrid, init_patch_positions
from attnlab.nn.captioner import ImageCaptioner
from attnlab.nn.vision import PatchEmbedding


@dataclass(frozen=True)
class CaptionerConfig(PatchGrid, TwoSidedSizes, TransformerConfig):
    """The image's size and channels and the caption vocabulary (set by the data), the patch size
    P (dividing both sides), where the patches sit (``patches.positional``), and the Transformer's
    fields for the two stacks: small, pre-norm and GELU by default, as ViT."""

    image_height: int = 32
    image_width: int = 32
    channels: int = 3
    patches: Patches = Patches(size=4, positional="learned_2d")
    depths: Depths = Depths()
    stack: StackConfig = StackConfig(d_model=128, n_heads=4, n_layers=3, d_ff=512, activation="gelu", norm="pre")
    tie_embeddings: str = "output"
    max_len: int = 64

    backends_fit = staticmethod(fields_free_exact)
    backends_refusal = IMAGE_BACKENDS_REFUSAL

    def check(self) -> None:
        self.check_sizes()
        super().check()
        self.check_patches()

    @property
    def src_vocab_size(self) -> None:
        """The source is an image: no vocabulary of its own."""
        return None


@register_family
class CaptionerFamily(ModelFamily):
    name = "captioner"
    config = CaptionerConfig
    capabilities = Capabilities(encoder=True, decoder=True, incremental_decoding=True, attention_weights=True,
                                inputs=Inputs.IMAGES)

    @staticmethod
    def build(cfg: CaptionerConfig) -> ImageCaptioner:
        tgt_embed = parts.embeddings(cfg, cfg.vocab_size)
        model = ImageCaptioner(PatchEmbedding(cfg.channels, cfg.patches.size, cfg.stack.d_model),
                               PATCH_POSITIONAL[cfg.patches.positional].from_config(cfg),
                               parts.plain_encoder(cfg, cfg.encoder_layers), tgt_embed,
                               parts.decoder(cfg, cfg.decoder_layers, cross=True),
                               parts.output_projection(cfg, tgt_embed), cfg.pad_id)
        parts.init_weights(model)
        init_patch_positions(model.positional)
        return model
