"""The Audio Spectrogram Transformer family (``arch: ast``; Gong et al. 2021): the ViT read over a
log-mel spectrogram. The model computes the log-mels from the waveforms on its own device
(``model.features``), masks them with SpecAugment in training (``model.augment``), cuts the
(n_mels, frames) image into P x P patches (``model.patches``, ViT's part; side by side, or one every
``hop`` pixels, overlapping, as the AST's; 2-D positions by default: a learned row (frequency) vector +
a learned column (time) vector), puts a class token (and the AST's distillation token) before them and
reads them with the ViT's pre-norm encoder stack; a head on the summary (``model.classifier``). The
encoder reads each clip's own patches, or the whole window (``reads: window``: the frames past a clip's
end hold the AST's padding, a log-fbank of zeros standardised), as the AST's Hugging Face folders need
(interop/ast.py).

What it takes from models/vit.py: Patches (the patch embedding and positions of the
grid, here of the spectrogram image: one channel, n_mels high, the frames that whole patches cover
wide), the backends an image's few patches fit, and ViT's initialisation. The frames past the last
whole patch are dropped (at most P - 1 of the longest clip's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from attnlab.config import flattened
from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.audio import WAVEFORMS, ClipReading, LogMelFeatures, SpecAugmentation, spectrogram
from attnlab.models.classifier import Classifier
from attnlab.models.family import Capabilities, FamilyConfig, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig, fields_free_exact
from attnlab.models.vit import IMAGE_BACKENDS_REFUSAL, SUMMARIES, Patches, init_patch_positions
from attnlab.nn.audio import AudioSpectrogramTransformer, ClipPatches, WindowPatches

OF = "arch 'ast'"
PATCH_READINGS: dict[str, Callable[[float], ClipPatches | WindowPatches]] = {
    "clip": lambda fill: ClipPatches(),
    "window": WindowPatches,
}  # model.reads -> which patches of a clip are read, given the padding's standardised value


@dataclass(frozen=True)
class ASTConfig(FamilyConfig):
    """``features`` (the log-mels), ``augment`` (SpecAugment), what the encoder ``reads`` of a clip (its
    own patches, or the whole window: the AST's), ``patches`` (size P, dividing n_mels where they sit
    side by side; their hop and positional scheme), the encoder's ``stack`` (pre-norm and GELU, as ViT
    and AST) and the ``classifier``: a class token and a linear head by default; the AST's own are
    ``pooling: distilled`` (its class and distillation tokens) and ``head: normed``."""

    features: LogMelFeatures = LogMelFeatures()
    augment: SpecAugmentation = SpecAugmentation()
    reading: ClipReading = flattened(ClipReading())
    patches: Patches = Patches(size=8, positional="learned_2d")
    stack: StackConfig = StackConfig(
        d_model=64, n_heads=4, n_layers=4, d_ff=128, activation="gelu", norm="pre", layer_norm_eps=1e-6
    )
    classifier: Classifier = Classifier(head="linear")

    def check(self) -> None:
        self.family.check_stack(self.stack)
        self.patches.check_width(self.stack.d_model)
        n_mels, size = self.features.n_mels, self.patches.size
        if n_mels < size or (self.patches.hop is None and n_mels % size):  # strided: AST's, rows left over
            raise ConfigError(f"features.n_mels ({n_mels}) must be {self.patches.whole_patches()}")

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
        frames = self.patches.covered(self.features.frames(shape, OF))
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
        summary = SUMMARIES[cfg.classifier.pooling](d_model)
        head = cfg.classifier.build(d_model, shape.need("n_classes", OF), cfg.stack.dropout, summary.pooling())
        spectrogram_of = spectrogram(cfg.features, cfg.augment, shape, OF, frames=image.need("image_width"))
        silence = (0.0 - cfg.features.offset) / cfg.features.scale  # the extractor's padding, standardised
        model = AudioSpectrogramTransformer(
            PATCH_READINGS[cfg.reading.reads](silence),
            spectrogram_of,
            cfg.patches.embedding(image, d_model, OF),
            cfg.patches.positions(image, d_model, OF),
            summary,
            parts.plain_encoder(cfg, cfg.stack.n_layers),
            head,
        )
        parts.init_weights(model)
        init_patch_positions(model.positional)
        return model
