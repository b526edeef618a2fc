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

from attnlab.config import TypedConfig, at_least, one_of
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


@dataclass(frozen=True)
class Patches(TypedConfig):
    """How an image is cut into patches (``model.patches`` of every family that reads images as
    patches): squares of ``size`` pixels, placed on the grid by ``positional``, a scheme of
    PATCH_POSITIONAL. Each family gives its defaults (ViT's 16 and 'learned')."""

    section: ClassVar[str] = "model.patches"

    size: int = 16
    positional: str = "learned"

    def __post_init__(self) -> None:
        self._check_types()
        at_least("patches.size", self.size, 1)
        one_of("patches.positional", self.positional, PATCH_POSITIONAL)


class PatchGrid:
    """What a config of an image cut into patches checks and derives (its dataclass declares
    image_height, image_width and channels, set by the data, and composes ``patches: Patches``):
    ViT's, the captioner's, the dual encoder's and the single stream's."""

    patches: Patches

    def check_patches(self) -> None:
        """Positive sizes, sides that the patch size divides, and a d_model that the patches'
        positional scheme can split."""
        for name in ("image_height", "image_width", "channels"):
            at_least(name, getattr(self, name), 1)
        for side in ("image_height", "image_width"):
            if getattr(self, side) % self.patches.size:
                raise ConfigError(f"{side} ({getattr(self, side)}) must be divisible by patches.size "
                                  f"({self.patches.size})")
        d_model = self.stack.d_model  # type: ignore[attr-defined]  # every patch family composes a stack
        if self.patches.positional == "sinusoidal_2d" and d_model % 4:
            raise ConfigError(f"patches.positional 'sinusoidal_2d' needs d_model divisible by 4 (a sine and a "
                              f"cosine per frequency, for rows and for columns); got {d_model}")

    @property
    def grid(self) -> tuple[int, int]:
        """(h, w): patches down and across."""
        h, w = getattr(self, "image_height"), getattr(self, "image_width")
        return h // self.patches.size, w // self.patches.size

    @property
    def patch_labels(self) -> list[str]:
        """'(row,col)' of each patch, row-major as nn/vision.py cuts them: the labels of attention plots."""
        return [f"({i},{j})" for i in range(self.grid[0]) for j in range(self.grid[1])]


@dataclass(frozen=True)
class ViTConfig(PatchGrid, FamilyConfig, AttentionStack):
    """The image's size and channels and the number of classes (set by the data), the ``patches``
    (size P, dividing both sides, and their positional scheme), and the encoder's fields, as the
    Transformer's: pre-norm and GELU by default, as ViT. ``head``: ``pooled``, a tanh layer before the output (ViT's pre-training
    head), or ``linear``, the output alone (ViT fine-tuned; an imported ViTForImageClassification)."""

    image_height: int
    image_width: int
    channels: int
    n_classes: int
    patches: Patches = Patches()
    stack: StackConfig = StackConfig(d_model=192, n_heads=3, n_layers=12, d_ff=768, activation="gelu", norm="pre", layer_norm_eps=1e-6)
    pooling: str = "cls"
    head: str = "pooled"

    backends_fit = staticmethod(fields_free_exact)
    backends_refusal = IMAGE_BACKENDS_REFUSAL

    def check(self) -> None:
        one_of("pooling", self.pooling, SUMMARIES)
        one_of("head", self.head, HEADS)
        self.check_stack()
        self.check_patches()
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
        model = VisionTransformer(PatchEmbedding(cfg.channels, cfg.patches.size, cfg.stack.d_model),
                                  PATCH_POSITIONAL[cfg.patches.positional].from_config(cfg), summary, parts.plain_encoder(cfg, cfg.stack.n_layers),
                                  HEADS[cfg.head](cfg.stack.d_model, cfg.n_classes, cfg.stack.dropout, summary.pooling()))
        parts.init_weights(model)
        init_patch_positions(model.positional)
        return model


def init_patch_positions(positional: PositionalEncoding) -> None:
    """The learned position tables of the patch grid N(0, 0.02^2), as ViT's reference code."""
    for table in positional.modules():
        if isinstance(table, nn.Embedding):
            nn.init.normal_(table.weight, std=0.02)
