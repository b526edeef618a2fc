"""A CLIP-style dual encoder (Radford et al. 2021, "Learning transferable visual models from natural
language supervision"): an image encoder and a text encoder, each projected to one joint space.

    I_f = ImageTower(images)              (B, d_model): the ViT's summary (class token or patch mean)
    T_f = TextTower(text)                 (B, d_model): the text encoder's summary (first token or mean)
    I_e = normalise(I_f W_i)              (B, d_embed), W_i without bias, as CLIP
    T_e = normalise(T_f W_t)              (B, d_embed)
    logits = exp(t) I_e T_e^T             (B, B): image i against text j, exp(t) at most max_logit_scale

and the symmetric InfoNCE loss over that in-batch similarity matrix (:func:`symmetric_info_nce`).
The temperature is learned in log form, t = log(1 / tau), from CLIP's tau = 0.07. CLIP clamps the
parameter to log 100 after each update; here the forward clamps exp(t) at ``max_logit_scale``,
which gives the same logits and no gradient to t past the bound, without a hook in the training
loop.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.embeddings import Embeddings
from attnlab.nn.layers import Encoder
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.tensor_plan import TensorPlan, megatron
from attnlab.nn.vision import ClassToken, PatchEmbedding, PatchEncoding, PatchMean


class ImageTower(PatchEncoding):
    """The ViT without its head: (B, C, H, W) -> (B, d_model), the class token's final state or the
    mean of the patches' (``summary``)."""

    def __init__(
        self,
        patch_embed: PatchEmbedding,
        positional: PositionalEncoding,
        summary: ClassToken | PatchMean,
        encoder: Encoder,
    ) -> None:
        super().__init__()
        self.patch_embed, self.positional, self.summary, self.encoder = patch_embed, positional, summary, encoder
        self.pooling = summary.pooling()

    def forward(self, images: Tensor) -> Tensor:
        z = self.encode_patches(images)  # (B, T, d_model), T = N (+ 1 with a class token)
        return self.pooling(z, torch.ones(z.shape[:2], dtype=torch.bool, device=z.device))


class TextTower(nn.Module):
    """The Transformer's encoder over token ids: (B, T) ids, PAD-padded -> (B, d_model), the first
    position's final state (a BOS there, BERT's [CLS]) or the mean over the real tokens (``pooling``)."""

    def __init__(self, embed: Embeddings, encoder: Encoder, pooling: nn.Module, pad_id: int) -> None:
        super().__init__()
        self.embed, self.encoder, self.pooling, self.pad_id = embed, encoder, pooling, pad_id

    def forward(self, ids: Tensor) -> Tensor:
        valid = ids != self.pad_id  # (B, T)
        positions = self.embed.positions(0, ids.shape[1], ids.device)
        return self.pooling(self.encoder(self.embed(ids, positions), valid, positions), valid)


class DualEncoder(nn.Module):
    """``model(images, text)`` -> (B, B) logits, image i (rows) against text j (columns);
    ``encode_image`` and ``encode_text`` give the unit vectors of the joint space."""

    def __init__(
        self,
        image: ImageTower,
        text: TextTower,
        d_model: int,
        d_embed: int,
        init_temperature: float,
        max_logit_scale: float,
    ) -> None:
        super().__init__()
        self.image, self.text = image, text
        self.image_projection = nn.Linear(d_model, d_embed, bias=False)  # W_i
        self.text_projection = nn.Linear(d_model, d_embed, bias=False)  # W_t
        self.log_logit_scale = nn.Parameter(torch.tensor(math.log(1 / init_temperature)))  # t = log(1 / tau)
        self.max_logit_scale = max_logit_scale

    def encode_image(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, d_embed), each of unit length."""
        return F.normalize(self.image_projection(self.image(images)), dim=-1)

    def encode_text(self, ids: Tensor) -> Tensor:
        """(B, T) ids -> (B, d_embed), each of unit length."""
        return F.normalize(self.text_projection(self.text(ids)), dim=-1)

    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of both towers' layers (train.strategy tp, nn/tensor_plan.py)."""
        return megatron(self, "image.encoder", "text.encoder")

    @property
    def logit_scale(self) -> Tensor:
        """exp(t) = 1 / tau, at most ``max_logit_scale``: () tensor."""
        return self.log_logit_scale.exp().clamp(max=self.max_logit_scale)

    def similarity(self, image_embeddings: Tensor, text_embeddings: Tensor) -> Tensor:
        """(B, d_embed) and (M, d_embed) unit vectors -> (B, M) logits exp(t) cos(image, text)."""
        return self.logit_scale * image_embeddings @ text_embeddings.T

    def forward(self, images: Tensor, text: Tensor) -> Tensor:
        return self.similarity(self.encode_image(images), self.encode_text(text))


def symmetric_info_nce(logits: Tensor, positives: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """CLIP's loss of each pair: (B, B) logits (image i, text j) and (B, B) boolean ``positives``
    (text j describes image i; the diagonal, and wherever two captions of the batch are the same)
    -> (B,) the mean of the image -> text and the text -> image cross-entropies of pair i.

    With one positive per row this is CLIP's InfoNCE. A caption repeated in a batch makes its
    copies false negatives of each other's images; here the target of image i is spread evenly
    over every text that describes it (and that of text j over every image it describes), the
    soft-target cross-entropy (Khosla et al. 2020's L_out), whose minimum over a row of k
    positives is log k rather than 0. ``label_smoothing`` eps (CLIP's is 0): each row's targets
    (1 - eps) q + eps / B, as F.cross_entropy smooths them."""
    targets = positives.float()
    image_to_text = F.cross_entropy(
        logits, targets / targets.sum(1, keepdim=True), reduction="none", label_smoothing=label_smoothing
    )  # (B,): row i over the texts
    text_to_image = F.cross_entropy(
        logits.T, targets.T / targets.T.sum(1, keepdim=True), reduction="none", label_smoothing=label_smoothing
    )  # (B,): column j over the images
    return (image_to_text + text_to_image) / 2
