"""The Audio Spectrogram Transformer family (``arch: ast``; Gong et al. 2021): the ViT read over a
log-mel spectrogram. The model computes the log-mels from the waveforms on its own device
(``model.features``), masks them with SpecAugment in training (``model.augment``), cuts the
(n_mels, frames) image into P x P patches (``model.patches``, ViT's part; 2-D positions by default:
a learned row (frequency) vector + a learned column (time) vector), puts a class token before them and
reads them with the ViT's pre-norm encoder stack; a linear head on the class token's final state.

What it takes from models/vit.py: Patches (the patch embedding and positions of the
grid, here of the spectrogram image: one channel, n_mels high, the frames that whole patches cover
wide), the backends an image's few patches fit, and ViT's initialisation. The frames past the last
whole patch are dropped (at most P - 1 of the longest clip's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.audio import WAVEFORMS, LogMelFeatures, SpecAugmentation, spectrogram
from attnlab.models.family import Capabilities, FamilyConfig, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig, fields_free_exact
from attnlab.models.vit import IMAGE_BACKENDS_REFUSAL, Patches, init_patch_positions
from attnlab.nn.audio import AudioSpectrogramTransformer
from attnlab.nn.pooling import FirstTokenPooling
from attnlab.nn.vision import ClassToken, LinearClassifier

OF = "arch 'ast'"


@dataclass(frozen=True)
class ASTConfig(FamilyConfig):
    """``features`` (the log-mels), ``augment`` (SpecAugment), ``patches`` (size P, dividing n_mels;
    positional scheme) and the encoder's ``stack``: pre-norm and GELU, as ViT and AST."""

    features: LogMelFeatures = LogMelFeatures()
    augment: SpecAugmentation = SpecAugmentation()
    patches: Patches = Patches(size=8, positional="learned_2d")
    stack: StackConfig = StackConfig(
        d_model=64, n_heads=4, n_layers=4, d_ff=128, activation="gelu", norm="pre", layer_norm_eps=1e-6
    )

    def check(self) -> None:
        self.family.check_stack(self.stack)
        self.patches.check_width(self.stack.d_model)
        if self.features.n_mels % self.patches.size:
            raise ConfigError(
                f"features.n_mels ({self.features.n_mels}) must be divisible by patches.size ({self.patches.size})"
            )

    def check_shape(self, shape: DataShape) -> None:
        self.features.check_shape(shape)
        if (
            shape.sample_rate is not None
            and shape.samples is not None
            and self.features.frames(shape) < self.patches.size
        ):
            raise ConfigError(
                f"the longest clip's {self.features.frames(shape)} frames are fewer than patches.size "
                f"({self.patches.size}): no whole patch"
            )

    def spectrogram_shape(self, shape: DataShape) -> DataShape:
        """The spectrogram as the image the patches cut: one channel, n_mels x the frames whole patches cover."""
        frames = self.features.frames(shape, OF) // self.patches.size * self.patches.size
        return dataclasses.replace(shape, channels=1, image_height=self.features.n_mels, image_width=frames)


@register_family
class ASTFamily(ModelFamily):
    name = "ast"
    config = ASTConfig
    # encoder/decoder mean reading and writing token sequences: a sound classifier does neither
    capabilities = Capabilities(
        encoder=False, decoder=False, incremental_decoding=False, attention_weights=True, inputs=WAVEFORMS
    )
    backends_fit = fields_free_exact  # a function read from the class: no self
    backends_refusal = IMAGE_BACKENDS_REFUSAL

    @staticmethod
    def build(cfg: ASTConfig, shape: DataShape) -> AudioSpectrogramTransformer:
        image = cfg.spectrogram_shape(shape)
        d_model = cfg.stack.d_model
        head = LinearClassifier(d_model, shape.need("n_classes", OF), cfg.stack.dropout, FirstTokenPooling())
        model = AudioSpectrogramTransformer(
            spectrogram(cfg.features, cfg.augment, shape, OF, frames=image.need("image_width")),
            cfg.patches.embedding(image, d_model, OF),
            cfg.patches.positions(image, d_model, OF),
            ClassToken(d_model),
            parts.plain_encoder(cfg, cfg.stack.n_layers),
            head,
        )
        parts.init_weights(model)
        init_patch_positions(model.positional)
        return model
