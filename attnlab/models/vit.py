"""The Vision Transformer family (``arch: vit``): patches of an image, a class token or mean
pooling, positions of the patch grid, the Transformer's pre-norm encoder and a classification head.

Initialisation: every Linear (the patch projection E included) as the Transformer's
(models/transformer.py: Xavier-uniform, zero bias); the class token zeros and the learned position
tables N(0, 0.02^2), as ViT's reference code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from torch import nn

from attnlab.config import TypedConfig, at_least, one_of
from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.classifier import Classifier
from attnlab.models.family import Capabilities, FamilyConfig, Inputs, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig, fields_free_exact
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.vision import (
    ClassToken,
    DistilledTokens,
    LearnedPatchPositional,
    LearnedRowColumnPositional,
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
SUMMARIES: dict[str, type[ClassToken] | type[PatchMean]] = {
    "cls": ClassToken,
    "distilled": DistilledTokens,  # DeiT's and the AST's class and distillation tokens
    "mean": PatchMean,
}

# What an image's attention needs of its backend: an image is a short sequence of patches (N + 1 tokens)
IMAGE_BACKENDS_REFUSAL = "is blockwise or approximate, which an image's few patches do not need"


@dataclass(frozen=True)
class Patches(TypedConfig):
    """How an image is cut into patches (``model.patches`` of every family that reads images as
    patches): squares of ``size`` pixels, one every ``hop`` pixels down and across (None: ``size``,
    side by side; less: overlapping, as the AST's), placed on the grid by ``positional``, a scheme of
    PATCH_POSITIONAL. Each family gives its defaults (ViT's 16 and 'learned')."""

    section: ClassVar[str] = "model.patches"

    size: int = 16
    positional: str = "learned"
    hop: Optional[int] = None

    def check(self) -> None:
        at_least("patches.size", self.size, 1)
        one_of("patches.positional", self.positional, PATCH_POSITIONAL)
        if self.hop is not None:
            at_least("patches.hop", self.hop, 1)

    @property
    def step(self) -> int:
        """Pixels from one patch to the next: the hop, or the size."""
        return self.hop or self.size

    def along(self, pixels: int) -> int:
        """Patches along a side of ``pixels`` (0 where it is shorter than one)."""
        return max(0, (pixels - self.size) // self.step + 1)

    def covered(self, pixels: int) -> int:
        """The pixels of a side that its patches cover, from the start."""
        return (self.along(pixels) - 1) * self.step + self.size if self.along(pixels) else 0

    def check_width(self, d_model: int) -> None:
        """A width ``d_model`` (the stack's) that the positional scheme can split."""
        if self.positional == "sinusoidal_2d" and d_model % 4:
            raise ConfigError(
                f"patches.positional 'sinusoidal_2d' needs d_model divisible by 4 (a sine and a "
                f"cosine per frequency, for rows and for columns); got {d_model}"
            )

    def check_image(self, shape: DataShape) -> None:
        """Sides of the data's images that the patches cover whole."""
        for side in ("image_height", "image_width"):
            size = getattr(shape, side)
            if size is not None and self.covered(size) != size:
                raise ConfigError(f"{side} ({size}) must be {self.whole_patches()}")

    def whole_patches(self) -> str:
        """What a side must be for whole patches to cover it, for messages."""
        if self.hop is None:
            return f"divisible by patches.size ({self.size})"
        return f"patches.size ({self.size}) plus a multiple of patches.hop ({self.hop})"

    def grid(self, shape: DataShape, of: str = "model.patches") -> tuple[int, int]:
        """(h, w): patches down and across the data's images; ``of``: who needs them, in the message
        of a size the data has not given ("arch 'vit'")."""
        return self.along(shape.need("image_height", of)), self.along(shape.need("image_width", of))

    def labels(self, shape: DataShape) -> list[str]:
        """'(row,col)' of each patch, row-major as nn/vision.py cuts them: the labels of attention plots."""
        h, w = self.grid(shape)
        return [f"({i},{j})" for i in range(h) for j in range(w)]

    def embedding(self, shape: DataShape, d_model: int, of: str = "model.patches") -> PatchEmbedding:
        """The linear map of each patch of the data's images (channels x P x P) to ``d_model``."""
        return PatchEmbedding(shape.need("channels", of), self.size, d_model, self.hop)

    def positions(self, shape: DataShape, d_model: int, of: str = "model.patches") -> PositionalEncoding:
        """The ``positional`` scheme over the data's grid, of width ``d_model``."""
        scheme = PATCH_POSITIONAL[self.positional]
        return scheme() if scheme is PositionalEncoding else scheme(d_model, self.grid(shape, of))


@dataclass(frozen=True)
class ViTConfig(FamilyConfig):
    """The ``patches`` (size P, dividing both sides of the data's images, and their positional
    scheme), the encoder's fields, as the Transformer's (pre-norm and GELU by default, as ViT), and the
    ``classifier``: ``pooling`` ``cls`` prepends ViT's class token, ``mean`` averages the patches;
    ``head`` ``pooled`` is ViT's pre-training head, ``linear`` ViT fine-tuned (an imported
    ViTForImageClassification)."""

    patches: Patches = Patches()
    stack: StackConfig = StackConfig(
        d_model=192, n_heads=3, n_layers=12, d_ff=768, activation="gelu", norm="pre", layer_norm_eps=1e-6
    )
    classifier: Classifier = Classifier()

    def check(self) -> None:
        self.family.check_stack(self.stack)
        self.patches.check_width(self.stack.d_model)

    def check_shape(self, shape: DataShape) -> None:
        self.patches.check_image(shape)


@register_family
class ViTFamily(ModelFamily):
    name = "vit"
    config = ViTConfig
    # encoder/decoder mean reading and writing token sequences: an image model does neither
    capabilities = Capabilities(
        encoder=False, decoder=False, incremental_decoding=False, attention_weights=True, inputs=Inputs.IMAGES
    )
    backends_fit = fields_free_exact  # a function read from the class: no self
    backends_refusal = IMAGE_BACKENDS_REFUSAL

    @staticmethod
    def build(cfg: ViTConfig, shape: DataShape) -> VisionTransformer:
        summary = SUMMARIES[cfg.classifier.pooling](cfg.stack.d_model)
        head = cfg.classifier.build(
            cfg.stack.d_model, shape.need("n_classes", "arch 'vit'"), cfg.stack.dropout, summary.pooling()
        )
        d_model, of = cfg.stack.d_model, "arch 'vit'"
        model = VisionTransformer(
            cfg.patches.embedding(shape, d_model, of),
            cfg.patches.positions(shape, d_model, of),
            summary,
            parts.plain_encoder(cfg, cfg.stack.n_layers),
            head,
        )
        parts.init_weights(model)
        init_patch_positions(model.positional)
        return model


def init_patch_positions(positional: nn.Module) -> None:
    """The learned position tables of the patch grid N(0, 0.02^2), as ViT's reference code."""
    for table in positional.modules():
        if isinstance(table, nn.Embedding):
            nn.init.normal_(table.weight, std=0.02)
