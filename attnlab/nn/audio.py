"""Classifiers of sound that compute their own log-mel features on the waveform's device.

    X      = LogMel(waveform)                          (frames, n_mels); SpecAugment's masks in training
    image  = X^T as one channel                        (1, n_mels, frames): frequency down, time across
    AST    = ViT over the image's P x P patches        (Gong et al. 2021, "AST: Audio Spectrogram Transformer")
    CNN    = SmallConvNet's convolutions, max over time (the non-Transformer baseline)

Clips are zero-padded to one length; a clip's own length (in samples) says which frames are its, so
SpecAugment draws its time masks inside the clip and the AST's attention skips patches that lie
wholly in the padding.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.nn.cnn import conv_features
from attnlab.nn.dropout import Dropout
from attnlab.nn.layers import Encoder
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.spectrogram import LogMel, SpecAugment
from attnlab.nn.vision import ClassToken, PatchEmbedding, PatchEncoding, PatchMean


class Spectrogram(nn.Module):
    """Waveforms (B, S) and their lengths (B,) in samples -> log-mel images (B, 1, n_mels, frames) and
    each clip's frames (B,), at least 1; only the first ``frames`` frames are kept (a patch grid's)."""

    def __init__(self, log_mel: LogMel, augment: SpecAugment, frames: int) -> None:
        super().__init__()
        self.log_mel, self.augment, self.frames = log_mel, augment, frames

    def features(self, waveforms: Tensor) -> Tensor:
        """(B, S) -> (B, frames, n_mels): the log-mel spectrogram, before augmentation and cropping."""
        features: Tensor = self.log_mel(waveforms)
        return features

    def forward(self, waveforms: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        frames = (lengths // self.log_mel.hop).clamp(1, self.frames)  # (B,): a clip's own frames
        x = self.augment(self.features(waveforms)[:, : self.frames], frames)  # (B, frames, n_mels)
        return x.transpose(1, 2).unsqueeze(1), frames  # (B, 1, n_mels, frames)


class AudioSpectrogramTransformer(PatchEncoding):
    """The AST: the log-mel image's patches (row-major over (n_mels / P, frames / P)), their 2-D
    positions, a class token, the ViT's encoder stack and a linear head on the class token.
    ``model.classify(waveforms, lengths)``: (B, S), (B,) -> (B, n_classes) logits."""

    def __init__(
        self,
        spectrogram: Spectrogram,
        patch_embed: PatchEmbedding,
        positional: PositionalEncoding,
        summary: ClassToken | PatchMean,
        encoder: Encoder,
        classifier: nn.Module,
    ) -> None:
        super().__init__()
        self.spectrogram, self.patch_embed, self.positional = spectrogram, patch_embed, positional
        self.summary, self.encoder, self.classifier = summary, encoder, classifier

    def patches_in_clip(self, frames: Tensor, grid: tuple[int, int]) -> Tensor:
        """(B,) frames of each clip -> (B, N) True where a patch starts inside the clip."""
        size = self.patch_embed.patch_size
        column = torch.arange(grid[0] * grid[1], device=frames.device) % grid[1]  # (N,): patch k's column
        return column[None, :] * size < frames[:, None]  # (B, N)

    def encode(self, waveforms: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S), (B,) -> final states (B, 1 + N, d_model) and (B, 1 + N) True at the class token and
        at the patches inside each clip."""
        image, frames = self.spectrogram(waveforms, lengths)  # (B, 1, n_mels, F), (B,)
        size = self.patch_embed.patch_size
        valid = self.patches_in_clip(frames, (image.shape[2] // size, image.shape[3] // size))
        return self.encode_some_patches(image, valid)

    def classify(self, waveforms: Tensor, lengths: Tensor) -> Tensor:
        """(B, S), (B,) -> (B, n_classes)."""
        z, valid = self.encode(waveforms, lengths)
        logits: Tensor = self.classifier(z, valid)  # (B, n_classes)
        return logits


class SpectrogramCNN(nn.Module):
    """nn/cnn.py's SmallConvNet convolutions over the same log-mel image as the AST's, then, unlike the
    images' net (a mean over every position, which forgets which band a pattern is in: at chance on
    spoken digits), the maximum over time of each channel and band, dropout and a linear classifier.
    ``model.classify(waveforms, lengths)``: (B, S), (B,) -> (B, n_classes) logits."""

    def __init__(self, spectrogram: Spectrogram, width: int, n_mels: int, n_classes: int, dropout: float) -> None:
        super().__init__()
        self.spectrogram = spectrogram
        self.features = conv_features(1, width)
        self.dropout = Dropout(dropout)
        self.out = nn.Linear(2 * width * (n_mels // 2), n_classes)

    def classify(self, waveforms: Tensor, lengths: Tensor) -> Tensor:
        """(B, S), (B,) -> (B, n_classes)."""
        image, _ = self.spectrogram(waveforms, lengths)  # (B, 1, n_mels, frames)
        x = self.features(image).amax(3)  # (B, 2 width, n_mels / 2, frames / 2) -> (B, 2 width, n_mels / 2)
        logits: Tensor = self.out(self.dropout(x.flatten(1)))  # (B, 2 width n_mels / 2) -> (B, n_classes)
        return logits
