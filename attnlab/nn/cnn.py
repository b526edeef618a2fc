"""A small convolutional network: the baseline that the Vision Transformer is measured against."""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.nn.dropout import Dropout


class SmallConvNet(nn.Module):
    """Two 3x3 convolutions of ``width`` channels, 2x2 max-pooling, a 3x3 convolution of 2 x width,
    ReLU after each, then the mean over positions, dropout and a linear classifier.
    ``model.classify(images)``: (B, C, H, W) -> (B, n_classes) logits."""

    def __init__(self, channels: int, width: int, n_classes: int, dropout: float) -> None:
        super().__init__()
        self.features = conv_features(channels, width)
        self.dropout = Dropout(dropout)
        self.out = nn.Linear(2 * width, n_classes)

    def classify(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, n_classes)."""
        features = self.features(images).mean((2, 3))  # (B, 2 width, H / 2, W / 2) -> (B, 2 width)
        return self.out(self.dropout(features))


def conv_features(channels: int, width: int) -> nn.Sequential:
    """SmallConvNet's convolutions: (B, C, H, W) -> (B, 2 width, H / 2, W / 2), ReLU after each."""
    return nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
    )
