"""A single-stream vision-and-language Transformer (ViLT, Kim et al. 2021; VisualBERT, Li et al.
2019): the question's tokens and the image's patches are one sequence, read by one encoder, so
every text token can attend to every patch and every patch to every text token.

    t = [w_CLS; w_1; ...; w_L; w_SEP] E_tok + P_1d + m_text      the question (B, T, d_model)
    v = [x_p^1 E; ...; x_p^N E] + P_2d + m_image                 the image's patches (B, N, d_model)
    z = Encoder([t; v])                                          one stream of T + N tokens
    y = head(z^0)                                                the [CLS] state -> answer logits

m_text and m_image are the two rows of a modality (segment) table: what tells a patch from a word
once positions of two kinds share one sequence. The text comes first, so its [CLS] (the question's
<bos>) is at position 0, as in ViLT. Without the image (``NoImage``: zero patch tokens) the same
model is a text classifier of the question alone: the baseline that shows what the image adds.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.nn.embeddings import Embeddings
from attnlab.nn.layers import Encoder
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.tensor_plan import TensorPlan, megatron
from attnlab.nn.vision import PatchEmbedding

TEXT, IMAGE = 0, 1  # rows of the modality table


class ImagePatches(nn.Module):
    """The image's tokens: x_p^k E + P_2d(k), the ViT's patch embedding and grid positions."""

    def __init__(self, patch_embed: PatchEmbedding, positional: PositionalEncoding) -> None:
        super().__init__()
        self.patch_embed, self.positional = patch_embed, positional

    def forward(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, N, d_model)."""
        x = self.patch_embed(images)  # (B, N, d_model)
        return self.positional.embed(x, torch.arange(x.shape[1], device=x.device))


class NoImage(nn.Module):
    """No image tokens: the text-only baseline, which never reads the pixels."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model

    def forward(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, 0, d_model)."""
        return images.new_zeros(images.shape[0], 0, self.d_model)


class SingleStreamTransformer(nn.Module):
    """``model.classify(images, ids)``: (B, C, H, W) images and (B, T) question ids ([CLS] ... [SEP],
    right-padded with ``pad_id``) -> (B, n_classes) answer logits."""

    def __init__(
        self,
        text_embed: Embeddings,
        image_tokens: ImagePatches | NoImage,
        modality: nn.Embedding,
        encoder: Encoder,
        classifier: nn.Module,
        pad_id: int,
    ) -> None:
        super().__init__()
        self.text_embed, self.image_tokens, self.modality = text_embed, image_tokens, modality
        self.encoder, self.classifier = encoder, classifier
        self.pad_id = pad_id

    def sequence(self, images: Tensor, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The one stream: its vectors (B, T + N, d_model), which are real (B, T + N), and each
        token's modality (T + N,): TEXT for the question's T, IMAGE for the N patches."""
        text = self.text_embed(ids, self.text_embed.positions(0, ids.shape[1], ids.device))  # (B, T, d_model)
        patches = self.image_tokens(images)  # (B, N, d_model)
        modality = torch.cat(
            [
                torch.full(ids.shape[1:], TEXT, device=ids.device),
                torch.full(patches.shape[1:2], IMAGE, device=ids.device),
            ]
        )  # (T + N,)
        x = torch.cat([text, patches.to(text.dtype)], dim=1) + self.modality(modality)  # (B, T + N, d_model)
        valid = torch.cat([ids != self.pad_id, ids.new_ones(patches.shape[:2], dtype=torch.bool)], dim=1)
        return x, valid, modality

    def encode(self, images: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
        """-> the final states (B, T + N, d_model) and which are real (B, T + N)."""
        x, valid, _ = self.sequence(images, ids)
        positions = torch.arange(x.shape[1], device=x.device)  # no scheme inside attention reads them
        return self.encoder(x, valid, positions), valid

    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of the encoder's layers (train.strategy tp, nn/tensor_plan.py)."""
        return megatron(self, "encoder")

    def classify(self, images: Tensor, ids: Tensor) -> Tensor:
        """-> (B, n_classes): the head on the [CLS] state."""
        return self.classifier(*self.encode(images, ids))
