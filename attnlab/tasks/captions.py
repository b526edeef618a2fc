"""The captioned images of a captioning run (tasks/captioning.py): its data section, the
built-in ``scenes`` (data/scenes.py: generated shapes with captions from a small grammar, an
in-distribution test split and a compositional one) or captions files (``image TAB caption``
lines, each image named relative to its file's folder, read with Pillow: ``resize``, ``colour`` as
for image classification), and their teacher-forcing batches.

Images are standardised per channel with the training split's statistics (task_state.json, with
the images' shape); captions are word-tokenised (``tokenizer``) and batched as a translation's
target: ``src`` of a batch is the (B, C, H, W) images.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, TypeVar, cast

import numpy as np
import torch
from torch import Tensor

from attnlab.config import at_least
from attnlab.data import scenes
from attnlab.data.batching import Batch, pad_sequences
from attnlab.data.images import Standardise, as_tensor, channels, colour_of, read_image, same_size
from attnlab.data.tokenizers import BOS, EOS, PAD, Tokenizer
from attnlab.errors import ConfigError, DataError, UsageError
from attnlab.models.shape import DataShape
from attnlab.tasks.abilities import RunState
from attnlab.tasks.batching import Tokenizers, batch_seed
from attnlab.tasks.parts import ImageSource, Splits, Text
from attnlab.tasks.scene_splits import SCENE_SPLITS, SCENE_SPLITS_READ, Scenes
from attnlab.tasks.task import Task, TaskConfig

BUILT_IN = ("scenes",)

Captioned = tuple[np.ndarray, list[str]]  # pixels (N, H, W, C) float32, and each image's caption


class CaptionedSection(Protocol):
    """What a data section of captioned images offers (captioning's, contrastive's): each composes
    the parts ``images``, ``scenes``, ``splits`` and ``text`` and declares the captions files and
    ``max_caption_len`` beside its own fields; the functions here read it."""

    @property
    def images(self) -> ImageSource: ...
    @property
    def scenes(self) -> Scenes: ...
    @property
    def splits(self) -> Splits: ...
    @property
    def text(self) -> Text: ...
    @property
    def train(self) -> Optional[str]: ...
    @property
    def valid(self) -> Optional[str]: ...
    @property
    def test(self) -> Optional[str]: ...
    @property
    def max_caption_len(self) -> int: ...


def check_captioned(cfg: CaptionedSection, task: str) -> None:
    """The checks of a section of captioned images: the scenes, or captions files, not both."""
    cfg.splits.read_by(task, SCENE_SPLITS_READ)
    cfg.images.built_in(BUILT_IN)
    if cfg.images.dataset is not None:
        given = [name for name in ("train", "valid", "test") if getattr(cfg, name) is not None]
        if given:
            raise ConfigError(
                f"dataset '{cfg.images.dataset}' brings its own splits and images; drop {', '.join(given)}"
            )
        cfg.scenes.check_drawn(cfg.splits)
    else:
        cfg.splits.given("n_valid")
    at_least("max_caption_len", cfg.max_caption_len, 1)


def check_captioned_trainable(cfg: CaptionedSection, task: str) -> None:
    if cfg.images.dataset is None and cfg.train is None:
        raise ConfigError(
            f"data.task '{task}' needs 'images.dataset' (scenes) or 'train' (a captions file: image TAB caption lines)"
        )


@dataclass(frozen=True)
class CaptioningConfig(TaskConfig):
    """``images: {dataset: scenes}`` (splits train, valid, test and compositional, drawn as
    ``scenes`` says with ``splits``' sizes and seed: tasks/scene_splits.py), or ``train`` (and
    optionally ``valid``, ``test``): captions files, their images read as ``images`` says (colour,
    resize: tasks/parts.py); without ``valid``, the last ``splits.n_valid`` of ``train`` validate.
    The captions are tokenised as ``text`` says. ``max_caption_len``: the most tokens of a caption
    (a longer one is refused, naming its file and line); decoding stops there too."""

    images: ImageSource = ImageSource()
    scenes: Scenes = Scenes()
    splits: Splits = SCENE_SPLITS
    text: Text = Text()
    train: Optional[str] = None
    valid: Optional[str] = None
    test: Optional[str] = None
    max_caption_len: int = 32

    splits_read = SCENE_SPLITS_READ

    def check(self) -> None:
        check_captioned(self, self.chosen_name())

    def check_trainable(self) -> None:
        check_captioned_trainable(self, self.task.name)

    @property
    def longest_sequence(self) -> int:
        return self.max_caption_len + 1  # BOS + caption, or caption + EOS

    @property
    def in_memory(self) -> bool:
        return self.images.dataset is not None


# -- reading ----------------------------------------------------------------------------------------


def generated_scenes(cfg: CaptionedSection) -> dict[str, Captioned]:
    """The four splits of the built-in scenes as pixels and captions."""
    return {
        split: (np.stack([s.pixels for s in drawn]).astype(np.float32), [s.caption for s in drawn])
        for split, drawn in cfg.scenes.drawn(cfg.splits).items()
    }


def read_captioned(path: str, colour: str, resize: int | tuple[int, int] | None) -> Captioned:
    """A captions file: each line's image (read with Pillow, in ``colour``, resized to ``resize``)
    and caption; the images must be of one size."""
    pairs = scenes.read_captions_file(path)
    pixels = [read_image(image, colour, resize) for image, _ in pairs]
    same_size(pixels, [image for image, _ in pairs])
    return np.stack(pixels), [caption for _, caption in pairs]


def read_splits(cfg: CaptionedSection) -> dict[str, Captioned]:
    if cfg.images.dataset is not None:
        return generated_scenes(cfg)
    splits = {
        name: read_captioned(getattr(cfg, name), cfg.images.colour, cfg.images.resize)
        for name in ("train", "valid", "test")
        if getattr(cfg, name) is not None
    }
    if "valid" not in splits:
        pixels, captions = splits["train"]
        n_valid = cfg.splits.n_valid or 0  # given: check_captioned
        if len(captions) <= n_valid:
            raise DataError(
                f"{cfg.train}: {len(captions)} captioned images are too few to hold out splits.n_valid "
                f"({n_valid}) for validation; give a 'valid' file"
            )
        splits |= {
            "train": (pixels[:-n_valid], captions[:-n_valid]),
            "valid": (pixels[-n_valid:], captions[-n_valid:]),
        }
    return splits


def encoded(captions: list[str], tokenizer: Tokenizer, longest: int, where: str) -> list[list[int]]:
    """Token ids of each caption; an empty one, or one of more than ``longest`` tokens, is refused."""
    ids = tokenizer.encode_batch(captions)
    for n, row in enumerate(ids, start=1):
        if not row or len(row) > longest:
            raise DataError(
                f"{where}: caption {n} has {len(row)} tokens; data.max_caption_len is {longest} "
                f"(and a caption needs at least one)"
            )
    return ids


# -- batches ------------------------------------------------------------------------------------------


@dataclass
class CaptionBatch(Batch):
    """src: (B, C, H, W) standardised images; tgt_in: (B, T) BOS + caption; tgt_out: (B, T) caption + EOS."""


@dataclass
class CaptionSplit:
    """One split: images (N, C, H, W) as read (0-255), the captions and their ids."""

    images: Tensor
    captions: list[str]
    ids: list[list[int]]

    def __len__(self) -> int:
        return len(self.captions)


def caption_batch(images: Tensor, ids: list[list[int]]) -> CaptionBatch:
    """Standardised images and caption ids -> a teacher-forcing batch."""
    return CaptionBatch(
        src=images,
        tgt_in=pad_sequences([[BOS] + row for row in ids]),
        tgt_out=pad_sequences([row + [EOS] for row in ids]),
    )


def captioned_splits(
    cfg: CaptionedSection, tokenizers: Tokenizers | None, state: dict[str, Any] | None
) -> tuple[dict[str, CaptionSplit], Tokenizers, Standardise]:
    """Every split of ``cfg`` read, its captions tokenised, with the tokenizers ({'src': None, 'tgt':
    the captions'}, fitted on the training captions unless given) and the standardisation (the
    run's ``state``, or fitted on the training images): what any task of captioned images reads."""
    read = read_splits(cfg)
    if tokenizers is None:
        tokenizers = {"src": None, "tgt": cfg.text.fitted(read["train"][1])}
    standardise = Standardise(state["mean"], state["std"]) if state else Standardise.fitted(read["train"][0])
    shape = read["train"][0].shape[1:]
    splits = {}
    for name, (pixels, captions) in read.items():
        where = getattr(cfg, name, None) or cfg.images.dataset or name
        if pixels.shape[1:] != shape:
            raise DataError(
                f"{where}: images of {pixels.shape[2]}x{pixels.shape[1]} pixels and "
                f"{channels(pixels.shape[3])}; the training images are {shape[1]}x{shape[0]} with "
                f"{channels(shape[2])} (set data.images.resize)"
            )
        splits[name] = CaptionSplit(
            as_tensor(pixels), captions, encoded(captions, tokenizers["tgt"], cfg.max_caption_len, where)
        )
    return splits, tokenizers, standardise


class ImageRows:
    """What a task's data of images shares when its examples are rows of a split (a split has
    ``images`` and a length), ``batch_size`` a batch: an epoch's order a permutation drawn from
    (seed, epoch) alone, so a resumed run goes on exactly; a split's evaluation batches its rows in
    order, made once. A mixin of methods: each data class declares ``splits``, ``batch_size``,
    ``seed`` and ``_eval``, and says how rows become a batch (``batches``)."""

    splits: dict[str, Any]
    batch_size: int
    seed: int
    _eval: dict[str, list[Any]]

    def batches(self, split: Any, rows: list[Tensor]) -> list[Any]:
        raise NotImplementedError

    def epoch_batches(self, epoch: int) -> list[Any]:
        train = self.splits["train"]
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(batch_seed(self.seed, epoch, 0)))
        return self.batches(train, list(order.split(self.batch_size)))

    def eval_batches(self, split: str) -> list[Any]:
        if split not in self._eval:
            self._eval[split] = self.batches(
                self.splits[split], list(torch.arange(len(self.splits[split])).split(self.batch_size))
            )
        return self._eval[split]

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W)."""
        return tuple(self.splits["train"].images.shape[1:])


@dataclass(kw_only=True)
class CaptionData(ImageRows):
    """The splits, the tokenizers ({'src': None, 'tgt': captions}), the standardisation and how
    batches are made: an epoch's order drawn from (seed, epoch) alone, so a resumed run goes on
    exactly."""

    splits: dict[str, CaptionSplit]
    tokenizers: Tokenizers
    standardise: Standardise
    batch_size: int
    max_caption_len: int
    seed: int = 0
    _eval: dict[str, list[CaptionBatch]] = field(default_factory=dict, repr=False)

    def batches(self, split: CaptionSplit, rows: list[Tensor]) -> list[CaptionBatch]:
        return [caption_batch(self.standardise(split.images[r]), [split.ids[i] for i in r.tolist()]) for r in rows]


def planned_shape(cfg: CaptionedSection) -> tuple[int, int, int]:
    """(H, W, C) of the images ``cfg`` will give, before reading them all."""
    if cfg.images.dataset is not None:
        return cfg.scenes.image_size, cfg.scenes.image_size, 3
    channels_ = 1 if cfg.images.colour == "grey" else 3
    if cfg.images.resize is not None:
        return cfg.images.resize, cfg.images.resize, channels_
    first = scenes.read_captions_file(cfg.train)[0][0]
    return read_image(first, cfg.images.colour, None).shape


CD = TypeVar("CD", bound=CaptionData)
CB = TypeVar("CB")


class CaptionedImages(Task[CD, CB]):
    """What every task of captioned images does (captioning, contrastive): its data's images and
    their sizes, and the captions' tokenizer."""

    tokenizers = ("tgt",)

    @property
    def section(self) -> CaptionedSection:
        """The task's data section, one of captioned images (a CaptioningConfig or ContrastiveConfig)."""
        return cast(CaptionedSection, self.cfg)

    def saved_state(self, data: CD) -> dict[str, Any]:
        """The images' (H, W, C) and the training split's pixel statistics."""
        channels_, height, width = data.image_shape
        return {"shape": [height, width, channels_], "mean": data.standardise.mean, "std": data.standardise.std}

    def data_shape(self, data: CD | None = None) -> DataShape:
        """Before the data is read, the image size it will give (planned_shape)."""
        if data is None:
            height, width, channels_ = planned_shape(self.section)
        else:
            channels_, height, width = data.image_shape
        return DataShape(
            image_height=height,
            image_width=width,
            channels=channels_,
            vocab_size=self.vocabulary(data, "tgt"),
            pad_id=PAD,
        )

    def describe(self, data: CD) -> str:
        sizes = ", ".join(f"{name} {len(split):,}" for name, split in data.splits.items())
        channels_, height, width = data.image_shape
        vocabulary = data.tokenizers["tgt"].vocab_size
        return f"captioned images {width}x{height}x{channels_}: {sizes}; vocabulary {vocabulary}"


def read_input_images(paths: list[str], run: RunState) -> Tensor:
    """`attnlab caption`'s image files -> (N, C, H, W), read and standardised as the run's training
    images, each resized (bilinear) to the model's size where it has another, with a note."""
    if not paths:
        raise UsageError("give the images to caption as arguments: attnlab caption RUN image.png [more.png ...]")
    state = run.read_task_state()
    shape = tuple(state["shape"])  # (H, W, C)
    pixels = []
    for path in paths:
        image = read_image(path, colour_of(shape), None)
        if image.shape[:2] != shape[:2]:
            print(
                f"note: {path}: {image.shape[1]}x{image.shape[0]} pixels, resized to the {shape[1]}x{shape[0]} the "
                f"model reads",
                file=sys.stderr,
            )
            image = read_image(path, colour_of(shape), shape[:2])
        pixels.append(image)
    return Standardise(state["mean"], state["std"])(as_tensor(np.stack(pixels)))
