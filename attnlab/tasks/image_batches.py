"""Images as an image model reads them, what image classification and the image encoder share:
their batches (ImageBatch: standardised pixels and class ids; ImageData: each split's pixels, an
epoch's order and augmentation drawn from (seed, epoch) alone), the sizes they give a model
(image_shape; planned_shape, before the images are read) and their validation pass
(image_analysis_pass)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.data.images import FLIPS, IMAGE_SUFFIXES, Standardise, random_crop, read_image, read_npz
from attnlab.errors import ConfigError, DataError
from attnlab.models.shape import DataShape
from attnlab.tasks.batching import batch_seed
from attnlab.tasks.classifier_task import ExampleBatch
from attnlab.tasks.parts import ImageSource


@dataclass
class ImageBatch(ExampleBatch):
    """images: (B, C, H, W), standardised; labels: (B,) class ids."""

    images: Tensor
    labels: Tensor

    def logits(self, model: Any) -> Tensor:  # an image classifier (model.classify)
        """(B, n_classes)."""
        return model.classify(self.images)


@dataclass(kw_only=True)
class ImageData:
    """Pixels (N, C, H, W) and class ids (N,) per split, the class names, and how batches are made:
    an epoch's order and augmentation drawn from (seed, epoch) alone, so a resumed run goes on
    exactly."""

    splits: dict[str, tuple[Tensor, Tensor]]
    labels: list[str]
    standardise: Standardise
    batch_size: int
    seed: int = 0
    crop_padding: int = 0
    flip: str = "none"
    _eval: dict[str, list[ImageBatch]] = field(default_factory=dict, repr=False)

    def augment(self, images: Tensor, generator: torch.Generator) -> Tensor:
        images = random_crop(images, self.crop_padding, generator) if self.crop_padding else images
        return FLIPS[self.flip](images, generator)

    def epoch_batches(self, epoch: int) -> list[ImageBatch]:
        images, labels = self.splits["train"]
        generator = torch.Generator().manual_seed(batch_seed(self.seed, epoch, 0))
        order = torch.split(torch.randperm(len(labels), generator=generator), self.batch_size)
        return [ImageBatch(self.standardise(self.augment(images[rows], generator)), labels[rows]) for rows in order]

    def eval_batches(self, split: str) -> list[ImageBatch]:
        if split not in self._eval:
            images, labels = self.splits[split]
            self._eval[split] = [
                ImageBatch(self.standardise(images[rows]), labels[rows])
                for rows in torch.split(torch.arange(len(labels)), self.batch_size)
            ]
        return self._eval[split]

    @property
    def image_shape(self) -> tuple[int, ...]:
        """(C, H, W)."""
        return tuple(self.splits["train"][0].shape[1:])


def image_shape(images: ImageSource, train: str | None, data: ImageData | None) -> DataShape:
    """The sizes of an image classifier's data: before it is read, the image size it will give (the
    resize, the built-in's 8x8x1, or the first training image's), two classes."""
    if data is None:
        height, width, channels = planned_shape(images, train)
    else:
        channels, height, width = data.image_shape
    return DataShape(
        image_height=height, image_width=width, channels=channels, n_classes=len(data.labels) if data is not None else 2
    )


def image_analysis_pass(model: Any, batch: ImageBatch) -> dict[str, Tensor]:
    """An image classifier's validation pass (Task.analysis_pass): every patch a real query."""
    states = model.encode(batch.images)  # (B, T, d_model)
    every = torch.ones(states.shape[:2], dtype=torch.bool, device=states.device)
    model.classifier(states, every)
    return {"encoder": every}


def planned_shape(images: ImageSource, train: str | None) -> tuple[int, int, int]:
    """(H, W, C) of the images read as ``images`` says from ``train`` (a folder or .npz file), before
    reading them all."""
    channels = 1 if images.colour == "grey" else 3
    if images.dataset is not None:
        return 8, 8, 1
    if train is not None and Path(train).suffix == ".npz":
        return read_npz(train)[0].shape[1:]
    if images.resize is not None:
        return images.resize, images.resize, channels
    if train is None:
        raise ConfigError("the images' size is unknown: give data.images.resize, or data.train")
    first = next(
        (
            path
            for folder in sorted(Path(train).glob("*/"))
            for path in sorted(folder.iterdir())
            if path.suffix.lower() in IMAGE_SUFFIXES
        ),
        None,
    )
    if first is None:
        raise DataError(f"{train}: no images in class folders")
    return read_image(first, images.colour, None).shape
