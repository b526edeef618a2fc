"""The single-stream vision-and-language family (``arch: single_stream``, nn/single_stream.py): a
question's tokens and an image's patches in one sequence with modality embeddings, through one
Transformer encoder, a [CLS] head over the answers.

One config for both modalities: the text side is the Transformer's (``embeddings``, ``positions``:
an absolute scheme, added at the embeddings, since the self-attention of the joint stream has no
positional hooks: a relative distance between a word and a patch would mean nothing), the image
side the ViT's (``patches``: their size and positional scheme over the grid). ``image_tokens``: ``patches``,
or ``none``, the text-only baseline, which has no patch embedding at all. ``head``: ViT's ``pooled``
(a tanh layer, BERT's and ViLT's pooler) or ``linear``. Initialisation: the Transformer's
(models/transformer.py), the patch position tables as ViT's, the modality table N(0, 0.02^2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from attnlab.config import one_of
from attnlab.models import transformer as parts
from attnlab.models.classifier import Classifier
from attnlab.models.family import Capabilities, FamilyConfig, Inputs, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig, fields_free_exact
from attnlab.models.transformer_config import Positions, TokenEmbeddings, TransformerFamily
from attnlab.models.vit import IMAGE_BACKENDS_REFUSAL, Patches, init_patch_positions
from attnlab.nn.backends import BackendOptions
from attnlab.nn.single_stream import ImagePatches, NoImage, SingleStreamTransformer

OF = "arch 'single_stream'"  # who needs a size the data has not given

# positions.scheme: where the words sit, added at the embeddings (no scheme inside the joint stream's attention)
TEXT_POSITIONAL = ("learned", "sinusoidal", "none")

# image_tokens: what the image contributes to the stream
IMAGE_TOKENS: dict[str, Callable[["SingleStreamConfig", DataShape], ImagePatches | NoImage]] = {
    "patches": lambda cfg, shape: ImagePatches(
        cfg.patches.embedding(shape, cfg.stack.d_model, OF), cfg.patches.positions(shape, cfg.stack.d_model, OF)
    ),
    "none": lambda cfg, shape: NoImage(cfg.stack.d_model),  # the text-only baseline
}


@dataclass(frozen=True)
class SingleStreamConfig(FamilyConfig):
    """The ``patches`` (size P, dividing both sides of the data's images, and positional scheme),
    ``image_tokens``, the ``classifier`` over the answers (``pooling`` ``cls``: the [CLS] token's
    state, ViLT's), and the Transformer's fields for the one encoder: small, pre-norm and GELU by
    default, as ViT and ViLT."""

    stack: StackConfig = StackConfig(d_model=64, n_heads=4, n_layers=2, d_ff=256, activation="gelu", norm="pre")
    positions: Positions = Positions(scheme="learned", max_len=32)
    embeddings: TokenEmbeddings = TokenEmbeddings(tie="none")
    backends: BackendOptions = BackendOptions()

    patches: Patches = Patches(size=4, positional="learned_2d")
    image_tokens: str = "patches"
    classifier: Classifier = Classifier()

    def check(self) -> None:
        one_of("image_tokens", self.image_tokens, IMAGE_TOKENS)
        one_of("positions.scheme", self.positions.scheme, TEXT_POSITIONAL)
        super().check()
        self.patches.check_width(self.stack.d_model)

    def check_shape(self, shape: DataShape) -> None:
        self.patches.check_image(shape)

    @property
    def encoder_layers(self) -> int:
        return self.stack.n_layers


@register_family
class SingleStreamFamily(TransformerFamily):
    name = "single_stream"
    config = SingleStreamConfig
    ties = ("none",)  # no output projection over the vocabulary to tie
    capabilities = Capabilities(
        encoder=True, decoder=False, incremental_decoding=False, attention_weights=True, inputs=Inputs.IMAGE_TEXT
    )
    backends_fit = fields_free_exact  # a function read from the class: no self
    backends_refusal = IMAGE_BACKENDS_REFUSAL

    @staticmethod
    def build(cfg: SingleStreamConfig, shape: DataShape) -> SingleStreamTransformer:
        of = OF
        head = cfg.classifier.build(cfg.stack.d_model, shape.need("n_classes", of), cfg.stack.dropout)
        model = SingleStreamTransformer(
            parts.embeddings(cfg, shape.need("vocab_size", of)),
            IMAGE_TOKENS[cfg.image_tokens](cfg, shape),
            nn.Embedding(2, cfg.stack.d_model),
            parts.plain_encoder(cfg, cfg.stack.n_layers),
            head,
            shape.pad_id,
        )
        parts.init_weights(model)
        init_patch_positions(model.image_tokens)
        nn.init.normal_(model.modality.weight, std=0.02)
        return model
