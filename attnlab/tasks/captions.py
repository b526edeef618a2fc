"""The captioned images of a captioning run (tasks/captioning.py), read as its data section says
(tasks/captions_section.py): the built-in ``scenes`` (data/scenes.py: generated shapes with
captions from a small grammar, an in-distribution test split and a compositional one) or captions
files (``image TAB caption`` lines, each image named relative to its file's folder, read with
Pillow: ``resize``, ``colour`` as for image classification), and their teacher-forcing batches.

Images are standardised per channel with the training split's statistics (task_state.json, with
the images' shape); captions are word-tokenised (``tokenizer``) and batched as a translation's
target: ``src`` of a batch is the (B, C, H, W) images.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import numpy as np
import torch
from torch import Tensor

from attnlab.data import scenes
from attnlab.data.batching import Batch, pad_sequences
from attnlab.data.images import Standardise, as_tensor, channels, colour_of, read_image, same_size
from attnlab.data.tokenizers import BOS, EOS, PAD, Tokenizer
from attnlab.errors import DataError, UsageError
from attnlab.models.shape import DataShape
from attnlab.tasks.abilities import RunState
from attnlab.tasks.batching import Tokenizers, batch_seed
from attnlab.tasks.captions_section import CaptionedSection
from attnlab.tasks.task import Task

Captioned = tuple[np.ndarray, list[str]]  # pixels (N, H, W, C) float32, and each image's caption


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
    splits = {name: read_captioned(path, cfg.images.colour, cfg.images.resize) for name, path in cfg.files.given()}
    if "valid" not in splits:
        pixels, captions = splits["train"]
        n_valid = cfg.splits.n_valid or 0  # given: check_captioned
        if len(captions) <= n_valid:
            raise DataError(
                f"{cfg.files.train}: {len(captions)} captioned images are too few to hold out splits.n_valid "
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
        where = getattr(cfg.files, name, None) or cfg.images.dataset or name  # compositional: no file
        if pixels.shape[1:] != shape:
            raise DataError(
                f"{where}: images of {pixels.shape[2]}x{pixels.shape[1]} pixels and "
                f"{channels(pixels.shape[3])}; the training images are {shape[1]}x{shape[0]} with "
                f"{channels(shape[2])} (set data.images.resize)"
            )
        splits[name] = CaptionSplit(
            as_tensor(pixels),
            captions,
            encoded(captions, cast(Tokenizer, tokenizers["tgt"]), cfg.captions.max_caption_len, where),
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
        return self.batches(train, list(torch.split(order, self.batch_size)))

    def eval_batches(self, split: str) -> list[Any]:
        if split not in self._eval:
            self._eval[split] = self.batches(
                self.splits[split], list(torch.split(torch.arange(len(self.splits[split])), self.batch_size))
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

    def batches(self, split: CaptionSplit, rows: list[Tensor]) -> list[Any]:  # CaptionBatch here; PairData's PairBatch
        return [caption_batch(self.standardise(split.images[r]), [split.ids[i] for i in r.tolist()]) for r in rows]


def planned_shape(cfg: CaptionedSection) -> tuple[int, int, int]:
    """(H, W, C) of the images ``cfg`` will give, before reading them all."""
    if cfg.images.dataset is not None:
        return cfg.scenes.image_size, cfg.scenes.image_size, 3
    channels_ = 1 if cfg.images.colour == "grey" else 3
    if cfg.images.resize is not None:
        return cfg.images.resize, cfg.images.resize, channels_
    first = scenes.read_captions_file(cast(str, cfg.files.train))[0][0]  # given: check_captioned
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
        vocabulary = cast(Tokenizer, data.tokenizers["tgt"]).vocab_size  # the task's own role: never None
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
