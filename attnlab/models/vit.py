"""The Vision Transformer family (``arch: vit``): patches of an image, a class token or mean
pooling, positions of the patch grid, the Transformer's pre-norm encoder and a classification head.

Initialisation: every Linear (the patch projection E included) as the Transformer's
(models/transformer.py: Xavier-uniform, zero bias); the class token zeros and the learned position
tables N(0, 0.02^2), as ViT's reference code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from attnlab.config import at_least, one_of
from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, FamilyConfig, Inputs, ModelFamily, register_family
from attnlab.models.stack import AttentionStack, StackConfig, fields_free_exact
from attnlab.nn.heads import ClassificationHead
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.vision import (
    ClassToken,
    LearnedPatchPositional,
    LearnedRowColumnPositional,
    LinearClassifier,
    PatchEmbedding,
    PatchMean,
    SinCos2DPositional,
    VisionTransformer,
)

# positional: where a patch sits on the grid, added to its embedding
PATCH_POSITIONAL: dict[str, type[PositionalEncoding]] = {
    "learned": LearnedPatchPositional,  # one learned vector per patch index (ViT's "1-D")
    "learned_2d": LearnedRowColumnPositional,  # a learned row vector + a learned column vector
    "sinusoidal_2d": SinCos2DPositional,  # fixed: half the channels the row's sinusoids, half the column's
    "none": PositionalEncoding,  # a bag of patches
}

# pooling: what summarises the image for the classifier
SUMMARIES: dict[str, type[nn.Module]] = {"cls": ClassToken, "mean": PatchMean}

# head: the classifier on the summary. "pooled": a tanh layer, then the output (ViT's pre-training
# head, BERT's pooler); "linear": the output alone (ViT fine-tuned, Hugging Face's
# ViTForImageClassification)
HEADS: dict[str, type[nn.Module]] = {"pooled": ClassificationHead, "linear": LinearClassifier}

# What an image's attention needs of its backend: an image is a short sequence of patches (N + 1 tokens)
IMAGE_BACKENDS_REFUSAL = "is blockwise or approximate, which an image's few patches do not need"


class PatchGrid:
    """What a config of an image cut into patches checks and derives (its dataclass declares
    image_height, image_width, channels, patch_size and d_model): ViT's and the captioner's."""

    def check_patches(self, field: str, positional: str) -> None:
        """Positive sizes, sides that the patch size divides, and a d_model that the ``positional``
        scheme (the config's ``field``) can split."""
        for name in ("image_height", "image_width", "channels", "patch_size"):
            at_least(name, getattr(self, name), 1)
        for side in ("image_height", "image_width"):
            if getattr(self, side) % self.patch_size:
                raise ConfigError(f"{side} ({getattr(self, side)}) must be divisible by patch_size "
                                  f"({self.patch_size})")
        if positional == "sinusoidal_2d" and self.stack.d_model % 4:
            raise ConfigError(f"{field} 'sinusoidal_2d' needs d_model divisible by 4 (a sine and a cosine "
                              f"per frequency, for rows and for columns); got {self.stack.d_model}")

    @property
    def grid(self) -> tuple[int, int]:
        """(h, w): patches down and across."""
        return self.image_height // self.patch_size, self.image_width // self.patch_size

    @property
    def patch_labels(self) -> list[str]:
        """'(row,col)' of each patch, row-major as nn/vision.py cuts them: the labels of attention plots."""
        return [f"({i},{j})" for i in range(self.grid[0]) for j in range(self.grid[1])]


@dataclass(frozen=True)
class ViTConfig(PatchGrid, FamilyConfig, AttentionStack):
    """The image's size and channels and the number of classes (set by the data), the patch size
    P (dividing both sides), and the encoder's fields, as the Transformer's: pre-norm and GELU by
    default, as ViT. ``head``: ``pooled``, a tanh layer before the output (ViT's pre-training
    head), or ``linear``, the output alone (ViT fine-tuned; an imported ViTForImageClassification)."""

    image_height: int
    image_width: int
    channels: int
    n_classes: int
    patch_size: int = 16
    stack: StackConfig = StackConfig(d_model=192, n_heads=3, n_layers=12, d_ff=768, activation="gelu", norm="pre", layer_norm_eps=1e-6)
    positional: str = "learned"
    pooling: str = "cls"
    head: str = "pooled"

    backends_fit = staticmethod(fields_free_exact)
    backends_refusal = IMAGE_BACKENDS_REFUSAL

    positional_schemes: ClassVar[dict[str, type[PositionalEncoding]]] = PATCH_POSITIONAL

    def check(self) -> None:
        one_of("positional", self.positional, PATCH_POSITIONAL)
        one_of("pooling", self.pooling, SUMMARIES)
        one_of("head", self.head, HEADS)
        self.check_stack()
        self.check_patches("positional", self.positional)
        at_least("n_classes", self.n_classes, 2)


@register_family
class ViTFamily(ModelFamily):
    name = "vit"
    config = ViTConfig
    # encoder/decoder mean reading and writing token sequences: an image model does neither
    capabilities = Capabilities(encoder=False, decoder=False, incremental_decoding=False, attention_weights=True,
                                inputs=Inputs.IMAGES)

    @staticmethod
    def build(cfg: ViTConfig) -> VisionTransformer:
        summary = SUMMARIES[cfg.pooling](cfg.stack.d_model)
        model = VisionTransformer(PatchEmbedding(cfg.channels, cfg.patch_size, cfg.stack.d_model),
                                  parts.positional(cfg, "embeddings"), summary, parts.encoder(cfg, cfg.stack.n_layers),
                                  HEADS[cfg.head](cfg.stack.d_model, cfg.n_classes, cfg.stack.dropout, summary.pooling()))
        parts.init_weights(model)
        init_patch_positions(model.positional)
        return model


def init_patch_positions(positional: PositionalEncoding) -> None:
    """The learned position tables of the patch grid N(0, 0.02^2), as ViT's reference code."""
    for table in positional.modules():
        if isinstance(table, nn.Embedding):
            nn.init.normal_(table.weight, std=0.02)
