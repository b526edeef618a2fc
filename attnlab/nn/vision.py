"""The Vision Transformer (Dosovitskiy et al. 2021, "An image is worth 16x16 words"): an image as a
sequence of patches, read by the Transformer's encoder.

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos      patches of P x P pixels, N = (H / P)(W / P)
    z_l = Encoder layers (pre-norm): MSA and MLP blocks with residuals
    y   = head(LN(z_L)^0)                               (or the mean of the patch states)

Patches are taken in row-major order over the grid (patch k sits at row k // w, column k % w of a
grid of h x w patches), each flattened channel-major, (c, row, col): the order of a Conv2d
weight's ``flatten(1)``, so the linear map E here is the strided convolution of the reference code
with the same weights (tests/test_vit.py). Positions are added to the patches only: the class
token is a learned vector, so a position of its own would add nothing learnable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.layers import Encoder
from attnlab.nn.pooling import FirstTokenPooling, FirstTwoPooling, MeanPooling
from attnlab.nn.positional import AbsolutePositional, PositionalEncoding, sinusoid
from attnlab.nn.tensor_plan import TensorPlan, megatron


def patches(images: Tensor, size: int, stride: int) -> Tensor:
    """(B, C, H, W) -> (B, N, C * size * size) flattened patches x_p, one every ``stride`` pixels down
    and across (``stride`` < ``size``: overlapping, as the AST's), N = h w with h = (H - size) // stride
    + 1 (and w alike), in row-major order over the grid, each flattened (c, row, col)."""
    return F.unfold(images, size, stride=stride).transpose(1, 2)  # (B, C P P, N) -> (B, N, C P P)


class PatchEmbedding(nn.Module):
    """x_p E: each flattened patch mapped linearly to d_model (equal to a Conv2d of kernel P and
    stride ``stride`` whose weight is E viewed as (d_model, C, P, P))."""

    def __init__(self, channels: int, patch_size: int, d_model: int, stride: int | None = None) -> None:
        super().__init__()
        self.patch_size, self.stride = patch_size, stride or patch_size
        self.projection = nn.Linear(channels * patch_size * patch_size, d_model)  # E (and a bias)

    def forward(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, N, d_model)."""
        return self.projection(patches(images, self.patch_size, self.stride))


# -- positions of the patches: absolute encodings of the patch index k = i w + j -----------------


class PatchPositional(AbsolutePositional):
    """An encoding of the patch at grid row i, column j, given its index k = i * w + j on a grid of
    h x w patches; added to the patch embeddings."""

    def __init__(self, d_model: int, grid: tuple[int, int]) -> None:
        super().__init__("add")
        self.d_model, self.grid = d_model, grid

    def rows_and_columns(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(N,) patch indices -> their (N,) rows and (N,) columns."""
        return positions // self.grid[1], positions % self.grid[1]


class LearnedPatchPositional(PatchPositional):
    """ViT's default: a learned vector per patch index, E_pos of (N, d_model) ("1-D")."""

    def __init__(self, d_model: int, grid: tuple[int, int]) -> None:
        super().__init__(d_model, grid)
        self.table = nn.Embedding(grid[0] * grid[1], d_model)

    def encode(self, positions: Tensor) -> Tensor:
        return self.table(positions)  # (N, d_model)


class LearnedRowColumnPositional(PatchPositional):
    """ViT's "2-D" variant: PE(i, j) = R[i] + C[j], a learned row table (h, d_model) and column
    table (w, d_model)."""

    def __init__(self, d_model: int, grid: tuple[int, int]) -> None:
        super().__init__(d_model, grid)
        self.rows = nn.Embedding(grid[0], d_model)
        self.columns = nn.Embedding(grid[1], d_model)

    def encode(self, positions: Tensor) -> Tensor:
        i, j = self.rows_and_columns(positions)
        return self.rows(i) + self.columns(j)  # (N, d_model)


class SinCos2DPositional(PatchPositional):
    """Fixed 2-D sinusoids (MAE, MoCo v3): the first d_model / 2 channels are the paper's 1-D table
    of the row, the last d_model / 2 that of the column, PE(i, j) = [sinusoid(i) ; sinusoid(j)],
    each with sin and cos interleaved, sinusoid(p)_2t = sin(p / 10000^(2t / D')), D' = d_model / 2.
    (MAE writes each half as [sin ...; cos ...] and puts the column first: the same values up to a
    fixed order of the channels.)"""

    def encode(self, positions: Tensor) -> Tensor:
        i, j = self.rows_and_columns(positions)
        half = self.d_model // 2
        return torch.cat([sinusoid(i, half), sinusoid(j, half)], dim=-1)  # (N, d_model)


# -- the summary of an image: a class token, or the mean of the patches ----------------------------


class ClassToken(nn.Module):
    """ViT's x_class: a learned vector put before the patches; its final state summarises the image
    (read by ``pooling``, the first position)."""

    pooling: type[nn.Module] = FirstTokenPooling

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.zeros(1, 1, d_model))  # zeros, as ViT initialises it

    def forward(self, x: Tensor) -> Tensor:
        """(B, N, d_model) patches -> (B, 1 + N, d_model)."""
        return torch.cat([self.token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)

    @staticmethod
    def attention_over_patches(weights: Tensor) -> Tensor:
        """(..., 1 + N, 1 + N) attention -> (..., N): what the class token attends to among the patches."""
        return weights[..., 0, 1:]


class DistilledTokens(ClassToken):
    """DeiT's two learned vectors before the patches (Touvron et al. 2021), which the AST keeps: the class
    token and the distillation token; the summary is the mean of their final states (``pooling``)."""

    pooling = FirstTwoPooling

    def __init__(self, d_model: int) -> None:
        super().__init__(d_model)
        self.token = nn.Parameter(torch.zeros(1, 2, d_model))  # [x_class; x_distil]

    @staticmethod
    def attention_over_patches(weights: Tensor) -> Tensor:
        """(..., 2 + N, 2 + N) attention -> (..., N): the two tokens' attention to the patches, averaged."""
        return weights[..., :2, 2:].mean(-2)


class PatchMean(nn.Module):
    """No class token: the summary is the mean of the patches' final states (``pooling``)."""

    pooling = MeanPooling

    def __init__(self, d_model: int) -> None:
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return x  # (B, N, d_model)

    @staticmethod
    def attention_over_patches(weights: Tensor) -> Tensor:
        """(..., N, N) attention -> (..., N): its mean over the queries, as the summary is their mean."""
        return weights.mean(-2)


class LinearClassifier(nn.Module):
    """The fine-tuned ViT's head (and Hugging Face's ViTForImageClassification): logits = W_c
    pool(h) + b_c, one linear map of the summary, no hidden layer (the pre-training head is
    ClassificationHead's tanh layer)."""

    def __init__(self, d_model: int, n_classes: int, dropout: float, pooling: nn.Module) -> None:
        super().__init__()
        self.pooling = pooling
        self.out = nn.Linear(d_model, n_classes)

    def forward(self, h: Tensor, valid: Tensor) -> Tensor:
        """(B, T, d_model), (B, T) True at real tokens -> (B, n_classes)."""
        return self.out(self.pooling(h, valid))


class NormedLinearClassifier(LinearClassifier):
    """The AST's head (ASTForAudioClassification's): logits = W_c LN(pool(h)) + b_c, a LayerNorm of the
    summary before the one linear map (``eps``: the AST's 1e-12)."""

    def __init__(self, d_model: int, n_classes: int, dropout: float, pooling: nn.Module, eps: float = 1e-12) -> None:
        super().__init__(d_model, n_classes, dropout, pooling)
        self.norm = nn.LayerNorm(d_model, eps=eps)

    def forward(self, h: Tensor, valid: Tensor) -> Tensor:
        """(B, T, d_model), (B, T) True at real tokens -> (B, n_classes)."""
        return self.out(self.norm(self.pooling(h, valid)))


class PatchEncoding(nn.Module):
    """The ViT's image encoder, for any model that reads images so: ``patch_embed``, ``positional``
    (of the patch grid), ``summary`` (a class token, or the patches alone) and ``encoder``, set by
    the subclass."""

    patch_embed: PatchEmbedding
    positional: PositionalEncoding
    summary: ClassToken | PatchMean
    encoder: Encoder

    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of the encoder's layers (train.strategy tp, nn/tensor_plan.py)."""
        return megatron(self, "encoder")

    def encode_patches(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, T, d_model) final states, T = N (+ 1 with a class token)."""
        return self.encode_some_patches(images, None)[0]

    def encode_some_patches(self, images: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor]:
        """(B, C, H, W), (B, N) True at the patches to read (None: all) -> (B, T, d_model) final
        states and (B, T) the tokens attended to (the class token always): a spectrogram's patches
        past the end of a short clip are skipped (nn/audio.py)."""
        x = self.patch_embed(images)  # (B, N, d_model): x_p^k E
        x = self.positional.embed(x, torch.arange(x.shape[1], device=x.device))  # + E_pos
        z = self.summary(x)  # (B, T, d_model): [x_class; ...] or the patches alone
        positions = torch.arange(z.shape[1], device=z.device)  # (T,): no scheme inside attention reads them
        every = torch.ones(z.shape[:2], dtype=torch.bool, device=z.device)  # (B, T)
        if valid is not None:
            every[:, z.shape[1] - valid.shape[1] :] = valid  # the patches are the last N tokens
        return self.encoder(z, every, positions), every


class VisionTransformer(PatchEncoding):
    """``model.classify(images)``: (B, C, H, W) -> (B, n_classes) logits."""

    def __init__(
        self,
        patch_embed: PatchEmbedding,
        positional: PositionalEncoding,
        summary: ClassToken | PatchMean,
        encoder: Encoder,
        classifier: nn.Module,
    ) -> None:
        super().__init__()
        self.patch_embed, self.positional, self.summary = patch_embed, positional, summary
        self.encoder, self.classifier = encoder, classifier

    def encode(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, T, d_model) final states, T = N (+ 1 with a class token)."""
        return self.encode_patches(images)

    def classify(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, n_classes)."""
        z = self.encode(images)  # (B, T, d_model), after the pre-norm stack's final LayerNorm
        return self.classifier(z, torch.ones(z.shape[:2], dtype=torch.bool, device=z.device))
