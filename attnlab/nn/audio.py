"""Classifiers of sound that compute their own log-mel features on the waveform's device.

    X      = LogMel(waveform)                          (frames, n_mels); SpecAugment's masks in training
    image  = X^T as one channel                        (1, n_mels, frames): frequency down, time across
    AST    = ViT over the image's P x P patches        (Gong et al. 2021, "AST: Audio Spectrogram Transformer")
    frames = Whisper's encoder over the frames          (Radford et al. 2022): a strided convolutional stem
    CNN    = SmallConvNet's convolutions, max over time (the non-Transformer baseline)

Clips are zero-padded to one length; a clip's own length (in samples) says which frames are its, so
SpecAugment draws its time masks inside the clip and the AST's attention skips patches that lie
wholly in the padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.cnn import conv_features
from attnlab.nn.dropout import Dropout
from attnlab.nn.layers import Encoder
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.spectrogram import KaldiFbank, LogMel, SpecAugment
from attnlab.nn.tensor_plan import TensorPlan, megatron
from attnlab.nn.vision import ClassToken, PatchEmbedding, PatchEncoding, PatchMean


class Spectrogram(nn.Module):
    """Waveforms (B, S) and their lengths (B,) in samples -> log-mel images (B, 1, n_mels, frames) and
    each clip's frames (B,), at least 1; only the first ``frames`` frames are kept (a patch grid's).
    The filterbank's output is standardised: (x - ``offset``) / ``scale``."""

    def __init__(
        self, log_mel: LogMel | KaldiFbank, augment: SpecAugment, frames: int, offset: float = 0.0, scale: float = 1.0
    ) -> None:
        super().__init__()
        self.log_mel, self.augment, self.frames = log_mel, augment, frames
        self.offset, self.scale = offset, scale

    def features(self, waveforms: Tensor) -> Tensor:
        """(B, S) -> (B, frames, n_mels): the standardised log-mels, before augmentation and cropping."""
        features: Tensor = self.log_mel(waveforms)
        return (features - self.offset) / self.scale

    def forward(self, waveforms: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        frames = self.log_mel.frames(lengths).clamp(1, self.frames)  # (B,): a clip's own frames
        x = self.augment(self.features(waveforms)[:, : self.frames], frames)  # (B, frames, n_mels)
        return x.transpose(1, 2).unsqueeze(1), frames  # (B, 1, n_mels, frames)


class ClipPatches(nn.Module):
    """attnlab's reading of a batch of spectrograms: each clip's patches that start inside it, the rest
    masked. (B, 1, n_mels, F) images, (B,) each clip's frames -> the images and (B, N) the patches read."""

    def forward(self, image: Tensor, frames: Tensor, grid: tuple[int, int], hop: int) -> tuple[Tensor, Tensor]:
        column = torch.arange(grid[0] * grid[1], device=frames.device) % grid[1]  # (N,): patch k's column
        return image, column[None, :] * hop < frames[:, None]  # (B, N)


class WindowPatches(nn.Module):
    """The AST's (ASTFeatureExtractor's padding): the frames past each clip's end hold ``fill`` (the
    extractor pads its log-fbank with zeros before standardising them: 0 standardised), and every patch
    of the window is read."""

    def __init__(self, fill: float) -> None:
        super().__init__()
        self.fill = fill

    def forward(self, image: Tensor, frames: Tensor, grid: tuple[int, int], hop: int) -> tuple[Tensor, Tensor]:
        past = torch.arange(image.shape[3], device=image.device)[None, :] >= frames[:, None]  # (B, F)
        every = torch.ones(image.shape[0], grid[0] * grid[1], dtype=torch.bool, device=image.device)  # (B, N)
        return image.masked_fill(past[:, None, None, :], self.fill), every


class AudioSpectrogramTransformer(PatchEncoding):
    """The AST: the log-mel image's patches (row-major over the grid of patches one every ``hop``
    pixels: side by side, or overlapping as the AST's), their positions, a class token (and the AST's
    distillation token), the ViT's encoder stack and a head on the summary; ``reads``: which patches of
    a clip are read (:class:`ClipPatches`, :class:`WindowPatches`).
    ``model.classify(waveforms, lengths)``: (B, S), (B,) -> (B, n_classes) logits."""

    def __init__(
        self,
        reads: ClipPatches | WindowPatches,
        spectrogram: Spectrogram,
        patch_embed: PatchEmbedding,
        positional: PositionalEncoding,
        summary: ClassToken | PatchMean,
        encoder: Encoder,
        classifier: nn.Module,
    ) -> None:
        super().__init__()
        self.reads, self.spectrogram, self.patch_embed, self.positional = reads, spectrogram, patch_embed, positional
        self.summary, self.encoder, self.classifier = summary, encoder, classifier

    def encode(self, waveforms: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S), (B,) -> final states (B, T + N, d_model), T the summary's tokens, and (B, T + N) True
        at those and at the patches read."""
        image, frames = self.spectrogram(waveforms, lengths)  # (B, 1, n_mels, F), (B,)
        image, valid = self.reads(image, frames, self.spectrogram_grid(image), self.patch_embed.stride)
        return self.encode_some_patches(image, valid)  # (B, 1, n_mels, F), (B, N) patches read

    def spectrogram_grid(self, image: Tensor) -> tuple[int, int]:
        """The patches down (bands) and across (frames) a (B, 1, n_mels, F) image."""
        size, hop = self.patch_embed.patch_size, self.patch_embed.stride
        return (image.shape[2] - size) // hop + 1, (image.shape[3] - size) // hop + 1

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


class ConvStem(nn.Module):
    """Whisper's stem: two convolutions of width 3 over time, GELU after each, the second with stride
    2, so that a token stands for two frames. (B, F, n_mels) frames and (B,) each clip's frames ->
    (B, ceil(F / 2), d_model) and (B,) each clip's tokens. The frames past a clip's end are zeroed
    before each convolution, as the convolutions' own padding is: a clip's tokens are the same alone
    as beside a longer clip."""

    def __init__(self, n_mels: int, d_model: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d_model, d_model, kernel_size=3, stride=2, padding=1)

    def forward(self, x: Tensor, frames: Tensor) -> tuple[Tensor, Tensor]:
        inside = (torch.arange(x.shape[1], device=x.device)[None, :] < frames[:, None]).unsqueeze(1)  # (B, 1, F)
        x = F.gelu(self.conv1(x.transpose(1, 2) * inside)) * inside  # (B, d_model, F)
        x = F.gelu(self.conv2(x))  # (B, d_model, ceil(F / 2))
        return x.transpose(1, 2), (frames + 1) // 2


class TokenStates(nn.Module):
    """The encoder over a sequence of sound tokens, for any model that reads sound so: ``positional``,
    ``summary`` (a class token, or the tokens alone) and ``encoder``, set by the subclass."""

    positional: PositionalEncoding
    summary: ClassToken | PatchMean
    encoder: Encoder

    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of the encoder's layers (train.strategy tp, nn/tensor_plan.py)."""
        return megatron(self, "encoder")

    def encode_tokens(self, x: Tensor, positions: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """(B, T, d_model) tokens at (T,) positions, (B, T) True at each clip's own -> final states
        (B, T', d_model) and (B, T') their validity, the class token (if any) first and valid."""
        x = self.positional.embed(x, positions)  # + PE
        z = self.summary(x)  # (B, T', d_model): [x_class; x] or x
        first = valid.new_ones(valid.shape[0], z.shape[1] - x.shape[1])  # (B, T' - T): the class token
        valid = torch.cat([first, valid], dim=1)  # (B, T')
        return self.encoder(z, valid, torch.arange(z.shape[1], device=z.device)), valid


class FrameEncoding(TokenStates):
    """Whisper's encoder over the log-mel frames, for any model that reads sound so (the frames
    classifier, the speech recogniser: nn/speech.py): ``spectrogram`` and ``stem`` besides
    :class:`TokenStates`' parts.

    X      = LogMel(waveform)           (B, F, n_mels); SpecAugment's masks in training
    H0     = ConvStem(X) + PE           (B, T, d_model), T = ceil(F / 2); PE Whisper's sinusoids
    H      = Encoder([x_class;] H0)     pre-norm layers and a final LayerNorm
    """

    spectrogram: Spectrogram
    stem: ConvStem

    def encode_frames(self, x: Tensor, frames: Tensor) -> tuple[Tensor, Tensor]:
        """(B, F, n_mels) log-mel frames, (B,) each clip's -> final states (B, T', d_model) and (B, T')
        True at the class token (if any) and at each clip's own tokens."""
        x, tokens = self.stem(x, frames)  # (B, T, d_model), (B,)
        positions = torch.arange(x.shape[1], device=x.device)  # (T,)
        return self.encode_tokens(x, positions, positions[None, :] < tokens[:, None])

    def encode_waveforms(self, waveforms: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S) waveforms, (B,) their samples -> final states (B, T', d_model) and their (B, T') validity."""
        image, frames = self.spectrogram(waveforms, lengths)  # (B, 1, n_mels, F), (B,)
        return self.encode_frames(image[:, 0].transpose(1, 2), frames)

    def spectrogram_grid(self, image: Tensor) -> tuple[int, int]:
        """One row of frame tokens, each two frames of a (B, 1, n_mels, F) image (the stem's stride)."""
        return 1, (image.shape[3] + 1) // 2


class TokenEncoding(TokenStates):
    """What every classifier of sound tokens shares, whatever makes its tokens (``encode``, set by the
    subclass): :class:`TokenStates` and the head. ``model.classify(waveforms, lengths)``: (B, S), (B,)
    -> (B, n_classes) logits."""

    def __init__(
        self, positional: PositionalEncoding, summary: ClassToken | PatchMean, encoder: Encoder, classifier: nn.Module
    ) -> None:
        super().__init__()
        self.positional, self.summary, self.encoder, self.classifier = positional, summary, encoder, classifier

    def encode(self, waveforms: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S), (B,) -> final states (B, T', d_model) and their (B, T') validity."""
        raise NotImplementedError

    def classify(self, waveforms: Tensor, lengths: Tensor) -> Tensor:
        """(B, S), (B,) -> (B, n_classes)."""
        z, valid = self.encode(waveforms, lengths)
        logits: Tensor = self.classifier(z, valid)  # (B, n_classes)
        return logits


class FrameTransformer(FrameEncoding, TokenEncoding):
    """Spectrogram frames as tokens: Whisper's encoder (:class:`FrameEncoding`), read as a classifier:
    logits = classifier(H, valid), the mean over a clip's tokens, or the class token's state."""

    def __init__(
        self,
        spectrogram: Spectrogram,
        stem: ConvStem,
        positional: PositionalEncoding,
        summary: ClassToken | PatchMean,
        encoder: Encoder,
        classifier: nn.Module,
    ) -> None:
        super().__init__(positional, summary, encoder, classifier)
        self.spectrogram, self.stem = spectrogram, stem

    def encode(self, waveforms: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        return self.encode_waveforms(waveforms, lengths)
