"""Image classification: an image to one of a set of classes. The data is a folder of class
folders of images (torchvision's ImageFolder layout, read with Pillow), an ``.npz`` file with
``images`` (N, H, W) or (N, H, W, C) and ``labels`` (N,), or the built-in ``digits``, split
stratified by class with ``splits.seed`` (0 by default; data/images.py reads them all). A folder
or file without a ``valid`` one gives up ``splits.n_valid`` training images the same way.

Pixels are standardised per channel with the training split's mean and standard deviation
(kept in task_state.json with the class names). Training batches may be augmented: a random crop
of the image padded with ``crop_padding`` zero pixels on each side, and (``flip: horizontal``) a
mirror image half of the time; both off by default (a flipped digit is another digit, or none).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, cast

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.config import at_least, flattened, one_of
from attnlab.data.images import (
    FLIPS,
    Images,
    Standardise,
    as_tensor,
    channels,
    colour_of,
    digits,
    read_image,
    read_images,
    stratified_split,
)
from attnlab.errors import ConfigError, DataError, UsageError
from attnlab.models.family import Inputs
from attnlab.models.shape import DataShape
from attnlab.nn.interfaces import Classifier
from attnlab.tasks.abilities import Prediction, PredictsLabels, RunState
from attnlab.tasks.batching import Batching, Tokenizers
from attnlab.tasks.classifier_task import ClassifierTask, evaluation_report
from attnlab.tasks.image_batches import ImageBatch, ImageData, image_analysis_pass, image_shape
from attnlab.tasks.parts import SPLIT_FILES, Files, ImageSource, Splits
from attnlab.tasks.task import TaskConfig, register_task


@dataclass(frozen=True)
class ImageClassificationConfig(TaskConfig):
    """``images: {dataset: digits}``, or ``train`` (and optionally ``valid``, ``test``): each a folder
    of class folders or an .npz file, read as ``images`` says (tasks/parts.py: colour, resize; resize
    is for folders, and for `predict`'s files). ``splits``: ``seed``, of the stratified draws (the
    digits' splits; the validation images of a training set without ``valid``), and ``n_valid``,
    how many those are. Augmentation: ``crop_padding``, ``flip``."""

    images: ImageSource = ImageSource()
    splits: Splits = Splits(seed=0, n_valid=100)
    files: Files = flattened(Files(), SPLIT_FILES)
    crop_padding: int = 0
    flip: str = "none"

    splits_read = ("seed", "n_valid")

    def check(self) -> None:
        self.images.built_in(list(BUILT_IN))
        self.splits.read_by(self.chosen_name(), self.splits_read)
        self.splits.given(*self.splits_read)
        if self.images.dataset is not None:
            given = [name for name, _ in self.files.given()]
            if given:
                raise ConfigError(f"dataset '{self.images.dataset}' brings its own splits; drop {', '.join(given)}")
        arrays = [path for _, path in self.files.given() if path.endswith(".npz")]
        if self.images.resize is not None and arrays:
            raise ConfigError(f"images.resize is for image folders; {arrays[0]} holds images of one size")
        one_of("flip", self.flip, FLIPS)
        at_least("crop_padding", self.crop_padding, 0)

    def check_trainable(self) -> None:
        if self.images.dataset is None and self.files.train is None:
            raise ConfigError(
                "data.task 'image_classification' needs 'dataset' (digits) or 'train' (an image folder or .npz file)"
            )

    @property
    def in_memory(self) -> bool:
        return self.images.dataset is not None


# -- reading ----------------------------------------------------------------------------------------

BUILT_IN: dict[str, Callable[[int], dict[str, Images]]] = {"digits": digits}


def read_splits(cfg: ImageClassificationConfig) -> dict[str, Images]:
    seed, n_valid = cfg.splits.seed or 0, cfg.splits.n_valid or 0  # given: ImageClassificationConfig.check
    if cfg.images.dataset is not None:
        return BUILT_IN[cfg.images.dataset](seed)
    splits = {name: read_images(path, cfg.images.colour, cfg.images.resize) for name, path in cfg.files.given()}
    if "valid" not in splits:
        images, labels = splits["train"]
        kept, held = stratified_split(labels, n_valid, seed, cast(str, cfg.files.train))  # read above: given
        splits |= {
            "train": (images[kept], [labels[i] for i in kept]),
            "valid": (images[held], [labels[i] for i in held]),
        }
    return splits


def class_names(labels: list[str]) -> list[str]:
    """The classes in id order: sorted as numbers when every label is an integer, else as text."""
    names = set(labels)
    numeric = all(name.lstrip("-").isdigit() for name in names)
    return sorted(names, key=int) if numeric else sorted(names)


def class_ids(labels: list[str], classes: list[str], path: str) -> Tensor:
    """(N,) class ids; a class the model was not trained on is refused, naming it."""
    index = {name: i for i, name in enumerate(classes)}
    unknown = sorted(set(labels) - set(index))
    if unknown:
        raise DataError(f"{path}: class '{unknown[0]}' is not one the model was trained on ({', '.join(classes)})")
    return torch.tensor([index[label] for label in labels])


def tensors(
    read: dict[str, Images],
    classes: list[str],
    cfg: ImageClassificationConfig,
    shape: tuple[int, ...] | None = None,
    source: str | None = None,
) -> dict[str, tuple[Tensor, Tensor]]:
    """Each split as (N, C, H, W) pixels and class ids; every split's images of one ``shape``
    (H, W, C), the training split's unless given. Errors name the split's file in ``cfg``, or
    ``source`` (a file `evaluate --data` reads)."""
    shape = shape or read["train"][0].shape[1:]
    out = {}
    for name, (pixels, labels) in read.items():
        where = source or getattr(cfg, name, None) or cfg.images.dataset or name
        if pixels.shape[1:] != tuple(shape):
            raise DataError(
                f"{where}: images of {pixels.shape[2]}x{pixels.shape[1]} pixels and "
                f"{channels(pixels.shape[3])}; the model reads {shape[1]}x{shape[0]} with "
                f"{channels(shape[2])} (set data.images.resize)"
            )
        out[name] = (as_tensor(pixels), class_ids(labels, classes, where))
    return out


@register_task
class ImageClassification(PredictsLabels, ClassifierTask[ImageData, ImageBatch]):
    """A label for each image (data.task: image_classification), scored by loss and accuracy."""

    name = "image_classification"
    config = ImageClassificationConfig
    needs = {"inputs": Inputs.IMAGES}
    commands = ("predict", "evaluate", "inspect")
    cfg: ImageClassificationConfig

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, Any] | None = None
    ) -> ImageData:
        read = read_splits(self.cfg)
        classes = state["labels"] if state else class_names(read["train"][1])
        if len(classes) < 2:
            raise DataError(f"{self.cfg.files.train}: one class ('{classes[0]}'); a classifier needs at least two")
        standardise = Standardise(state["mean"], state["std"]) if state else Standardise.fitted(read["train"][0])
        return ImageData(
            splits=tensors(read, classes, self.cfg),
            labels=classes,
            standardise=standardise,
            batch_size=batching.batch_size,
            seed=batching.seed,
            crop_padding=self.cfg.crop_padding,
            flip=self.cfg.flip,
        )

    def saved_state(self, data: ImageData) -> dict[str, Any]:
        """The class names in id order, the images' (H, W, C) and the training split's pixel statistics."""
        channels, height, width = data.image_shape
        return {
            "labels": data.labels,
            "shape": [height, width, channels],
            "mean": data.standardise.mean,
            "std": data.standardise.std,
        }

    def data_shape(self, data: ImageData | None = None) -> DataShape:
        return image_shape(self.cfg.images, self.cfg.files.train, data)

    def analysis_pass(self, model: nn.Module, batch: ImageBatch) -> dict[str, Tensor]:
        return image_analysis_pass(model, batch)

    def evaluate_file(
        self, model: nn.Module, tokenizers: Tokenizers, state: dict[str, Any], path: str, split: str | None
    ) -> dict[str, Any]:
        """Loss, accuracy, macro-F1 and the confusion matrix on an image folder or .npz file, read
        and standardised as the run's training data was."""
        self.refuse_split(split)
        pixels, labels = read_images(path, colour_of(state["shape"]), self.cfg.images.resize)
        shape = tuple(state["shape"])
        images, ids = tensors({"test": (pixels, labels)}, state["labels"], self.cfg, shape, path)["test"]
        standardise = Standardise(state["mean"], state["std"])
        batches = [
            ImageBatch(standardise(images[rows]), ids[rows]) for rows in torch.split(torch.arange(len(ids)), 256)
        ]
        return evaluation_report(model, batches, state["labels"])

    @torch.no_grad()
    def predict(
        self,
        model: nn.Module,
        run: RunState,
        inputs: list[str],
        input_file: str | None,
        batch_size: int,
        **options: str,
    ) -> list[Prediction]:
        """Each image file named, read as in training."""
        if input_file is not None or not inputs:
            raise UsageError("give the images to classify as arguments: attnlab predict RUN image.png [more.png ...]")
        images = read_inputs(inputs, run)
        model.eval()
        device = next(model.parameters()).device
        probabilities = torch.cat(
            [
                cast(Classifier, model).classify(chunk.to(device)).float().softmax(-1).cpu()  # an image classifier
                for chunk in torch.split(images, batch_size)
            ]
        )
        return list(zip(inputs, probabilities.tolist()))

    def describe(self, data: ImageData) -> str:
        sizes = ", ".join(f"{name} {len(labels):,}" for name, (_, labels) in data.splits.items())
        channels, height, width = data.image_shape
        augmentation = [f"random crop (padding {data.crop_padding})"] * bool(data.crop_padding) + [
            f"{data.flip} flip"
        ] * (data.flip != "none")
        return (
            f"images {width}x{height}x{channels}: {sizes}; {len(data.labels)} classes {', '.join(data.labels)}; "
            f"augmentation {', '.join(augmentation) or 'none'}"
        )


def read_input_image(path: str, run: RunState) -> np.ndarray:
    """One image file as the run's model reads it: (H, W, C) pixels in its colours, read as its
    training images were (data.images.resize), and resized (bilinear) to its size if it has another one,
    with a note on stderr saying so (a 64x64 drawing for the 8x8 digits model)."""
    _, cfg, _ = run.read_config()
    shape = tuple(run.read_task_state()["shape"])  # (H, W, C)
    image = read_image(path, colour_of(shape), cast(ImageClassificationConfig, cfg).images.resize)  # the run's
    if image.shape[:2] != shape[:2]:
        print(
            f"note: {path}: {image.shape[1]}x{image.shape[0]} pixels, resized to the {shape[1]}x{shape[0]} the "
            f"model reads",
            file=sys.stderr,
        )
        image = read_image(path, colour_of(shape), shape[:2])
    return image


def read_inputs(paths: list[str], run: RunState) -> Tensor:
    """Image files -> (N, C, H, W) standardised as the run's training data, each of the model's
    size (:func:`read_input_image`)."""
    state = run.read_task_state()
    pixels = [read_input_image(path, run) for path in paths]
    return Standardise(state["mean"], state["std"])(as_tensor(np.stack(pixels)))
