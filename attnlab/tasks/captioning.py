"""Image captioning: an image to a sentence. The data is the built-in ``scenes``
(data/scenes.py: generated shapes with captions from a small grammar, an in-distribution test
split and a compositional one) or captions files: ``image TAB caption`` lines, each image named
relative to its file's folder and read with Pillow (``resize``, ``colour`` as for image
classification).

Images are standardised per channel with the training split's statistics (task_state.json, with
the images' shape); captions are word-tokenised (``tokenizer``) and trained by teacher forcing,
as a translation's target: ``src`` of a batch is the (B, C, H, W) images. Validation adds the
exact match of greedy captions; `attnlab evaluate --split NAME` (or ``--data FILE``, a captions
file) gives exact match and sacrebleu's BLEU of greedy captions and the references' perplexity;
`attnlab caption RUN image.png` decodes by greedy or beam search with the KV cache.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.config import at_least, one_of
from attnlab.data import scenes
from attnlab.data.batching import Batch, pad_sequences
from attnlab.data.tokenizers import BOS, EOS, PAD, TOKENIZER_KINDS, Tokenizer
from attnlab.decode.search import beam_search, greedy
from attnlab.errors import ConfigError, DataError, UsageError
from attnlab.eval.likelihood import evaluate as teacher_forced
from attnlab.eval.metrics import corpus_bleu, exact_match
from attnlab.models.family import Inputs
from attnlab.tasks.image_classification import (
    COLOURS, Standardise, as_tensor, channels, colour_of, read_image, same_size,
)
from attnlab.tasks.task import Amp, Batching, NextTokenTask, TaskConfig, Tokenizers, batch_seed, register_task

BUILT_IN = ("scenes",)

Captioned = tuple[np.ndarray, list[str]]  # pixels (N, H, W, C) float32, and each image's caption


@dataclass(frozen=True)
class CaptioningConfig(TaskConfig):
    """``dataset: scenes`` (splits train, valid, test and compositional; ``seed``, the sizes
    ``n_train`` / ``n_valid`` / ``n_test`` (each test split), ``held_out`` (comma-separated
    'COLOUR SHAPE' combinations kept out of training), ``image_size`` (32 or more), ``noise`` (the
    pixel noise's standard deviation, 0-255 scale), ``max_objects``), or ``train`` (and optionally
    ``valid``, ``test``): captions files. ``max_caption_len``: the most tokens of a caption (a
    longer one is refused, naming its file and line); decoding stops there too."""

    dataset: Optional[str] = None
    train: Optional[str] = None
    valid: Optional[str] = None
    test: Optional[str] = None
    seed: int = 0
    n_train: int = 4000
    n_valid: int = 200
    n_test: int = 500
    held_out: str = "red triangle"
    image_size: int = 32
    noise: float = 0.0
    max_objects: int = 3
    resize: Optional[int] = None
    colour: str = "rgb"
    tokenizer: str = "word"
    vocab_size: int = 8000
    max_caption_len: int = 32

    def check(self) -> None:
        if self.dataset is not None:
            one_of("dataset", self.dataset, BUILT_IN)
            given = [name for name in ("train", "valid", "test", "resize") if getattr(self, name) is not None]
            if given:
                raise ConfigError(f"dataset '{self.dataset}' brings its own splits and images; drop {', '.join(given)}")
        try:
            scenes.check_held_out(self.held_combinations)
        except ValueError as err:
            raise ConfigError(f"held_out: {err}") from None
        if self.dataset is not None and not self.held_combinations:
            raise ConfigError("held_out names no 'COLOUR SHAPE' combination; the compositional split needs at least "
                              "one (e.g. 'red triangle')")
        one_of("colour", self.colour, COLOURS)
        one_of("tokenizer", self.tokenizer, TOKENIZER_KINDS)
        for name in ("n_train", "n_valid", "n_test", "max_caption_len", "vocab_size"):
            at_least(name, getattr(self, name), 1)
        at_least("image_size", self.image_size, 16)
        if not 1 <= self.max_objects <= scenes.GRID ** 2:
            raise ConfigError(f"max_objects must be between 1 and {scenes.GRID ** 2} (got {self.max_objects})")
        if self.noise < 0:
            raise ConfigError(f"noise must be >= 0 (got {self.noise})")
        if self.resize is not None:
            at_least("resize", self.resize, 1)

    def check_trainable(self) -> None:
        if self.dataset is None and self.train is None:
            raise ConfigError(f"data.task '{self.task.name}' needs 'dataset' (scenes) or 'train' (a captions file: "
                              "image TAB caption lines)")

    @property
    def held_combinations(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.held_out.split(",") if name.strip())

    @property
    def longest_sequence(self) -> int:
        return self.max_caption_len + 1  # BOS + caption, or caption + EOS

    @property
    def in_memory(self) -> bool:
        return self.dataset is not None


# -- reading ----------------------------------------------------------------------------------------

def generated_scenes(cfg: CaptioningConfig) -> dict[str, Captioned]:
    """The four splits of the built-in scenes as pixels and captions."""
    sizes = {"train": cfg.n_train, "valid": cfg.n_valid, "test": cfg.n_test, "compositional": cfg.n_test}
    out = {}
    for split, n in sizes.items():
        drawn = scenes.generate(split, n, cfg.seed, cfg.held_combinations, cfg.image_size, cfg.noise, cfg.max_objects)
        out[split] = (np.stack([s.pixels for s in drawn]).astype(np.float32), [s.caption for s in drawn])
    return out


def read_captioned(path: str, colour: str, resize: int | tuple[int, int] | None) -> Captioned:
    """A captions file: each line's image (read with Pillow, in ``colour``, resized to ``resize``)
    and caption; the images must be of one size."""
    pairs = scenes.read_captions_file(path)
    pixels = [read_image(image, colour, resize) for image, _ in pairs]
    same_size(pixels, [image for image, _ in pairs])
    return np.stack(pixels), [caption for _, caption in pairs]


def read_splits(cfg: CaptioningConfig) -> dict[str, Captioned]:
    if cfg.dataset is not None:
        return generated_scenes(cfg)
    splits = {name: read_captioned(getattr(cfg, name), cfg.colour, cfg.resize) for name in ("train", "valid", "test")
              if getattr(cfg, name) is not None}
    if "valid" not in splits:
        pixels, captions = splits["train"]
        if len(captions) <= cfg.n_valid:
            raise DataError(f"{cfg.train}: {len(captions)} captioned images are too few to hold out n_valid "
                            f"({cfg.n_valid}) for validation; give a 'valid' file")
        splits |= {"train": (pixels[:-cfg.n_valid], captions[:-cfg.n_valid]),
                   "valid": (pixels[-cfg.n_valid:], captions[-cfg.n_valid:])}
    return splits


def encoded(captions: list[str], tokenizer: Tokenizer, longest: int, where: str) -> list[list[int]]:
    """Token ids of each caption; an empty one, or one of more than ``longest`` tokens, is refused."""
    ids = tokenizer.encode_batch(captions)
    for n, row in enumerate(ids, start=1):
        if not row or len(row) > longest:
            raise DataError(f"{where}: caption {n} has {len(row)} tokens; data.max_caption_len is {longest} "
                            f"(and a caption needs at least one)")
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
    return CaptionBatch(src=images, tgt_in=pad_sequences([[BOS] + row for row in ids]),
                        tgt_out=pad_sequences([row + [EOS] for row in ids]))


def captioned_splits(cfg: CaptioningConfig, tokenizers: Tokenizers | None, state: dict[str, Any] | None
                     ) -> tuple[dict[str, CaptionSplit], Tokenizers, Standardise]:
    """Every split of ``cfg`` read, its captions tokenised, with the tokenizers ({'src': None, 'tgt':
    the captions'}, fitted on the training captions unless given) and the standardisation (the
    run's ``state``, or fitted on the training images): what any task of captioned images reads."""
    read = read_splits(cfg)
    if tokenizers is None:
        tokenizers = {"src": None, "tgt": Tokenizer.train(cfg.tokenizer, read["train"][1], cfg.vocab_size)}
    standardise = Standardise(state["mean"], state["std"]) if state else Standardise.fitted(read["train"][0])
    shape = read["train"][0].shape[1:]
    splits = {}
    for name, (pixels, captions) in read.items():
        where = getattr(cfg, name, None) or cfg.dataset or name
        if pixels.shape[1:] != shape:
            raise DataError(f"{where}: images of {pixels.shape[2]}x{pixels.shape[1]} pixels and "
                            f"{channels(pixels.shape[3])}; the training images are {shape[1]}x{shape[0]} with "
                            f"{channels(shape[2])} (set data.resize)")
        splits[name] = CaptionSplit(as_tensor(pixels), captions,
                                    encoded(captions, tokenizers["tgt"], cfg.max_caption_len, where))
    return splits, tokenizers, standardise


@dataclass(kw_only=True)
class CaptionData:
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

    def epoch_batches(self, epoch: int) -> list[CaptionBatch]:
        train = self.splits["train"]
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(batch_seed(self.seed, epoch, 0)))
        return self.batches(train, list(order.split(self.batch_size)))

    def eval_batches(self, split: str) -> list[CaptionBatch]:
        if split not in self._eval:
            self._eval[split] = self.batches(self.splits[split], list(torch.arange(len(self.splits[split]))
                                                                       .split(self.batch_size)))
        return self._eval[split]

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W)."""
        return tuple(self.splits["train"].images.shape[1:])


# -- decoding and scoring -------------------------------------------------------------------------------

@torch.no_grad()
def caption_images(model: nn.Module, tokenizer: Tokenizer, images: Tensor, max_len: int, beam: int = 1,
                   lenpen: float = 0.6, nbest: int = 1, use_cache: bool = True, kv_cache: str = "auto",
                   batch_size: int = 64) -> list[list[tuple[str, float | None]]]:
    """(N, C, H, W) standardised images -> each one's ``nbest`` captions as (text, score): log P /
    length penalty for beam search, None for greedy (``beam`` 1); at most ``max_len`` tokens."""
    model.eval()
    device = next(model.parameters()).device
    out: list[list[tuple[str, float | None]]] = []
    for chunk in images.split(batch_size):
        chunk = chunk.to(device)
        if beam == 1 and nbest == 1:
            out += [[(tokenizer.decode(ids), None)] for ids in greedy(model, chunk, max_len, 0, use_cache, kv_cache)]
        else:
            out += [[(tokenizer.decode(h.tokens), h.normalized) for h in hyps]
                    for hyps in beam_search(model, chunk, beam, lenpen, nbest, max_len, 0, use_cache, kv_cache)]
    return out


def caption_record(model: nn.Module, tokenizer: Tokenizer, images: Tensor, references: list[str], max_len: int,
                   beam: int = 1) -> dict[str, Any]:
    """Exact match and BLEU (sacrebleu, with its signature) of the captions of ``images`` (standardised)
    against ``references``, and the references' teacher-forced perplexity."""
    hypotheses = [nbest[0][0] for nbest in caption_images(model, tokenizer, images, max_len, beam)]
    bleu, signature = corpus_bleu(hypotheses, references)
    ids = tokenizer.encode_batch(references)
    batches = [caption_batch(images[i:i + 64], ids[i:i + 64]) for i in range(0, len(ids), 64)]
    likelihood = teacher_forced(model, batches)
    return {"exact_match": exact_match(hypotheses, references), "bleu": bleu, "bleu_signature": signature,
            "ppl": likelihood["ppl"], "nll": likelihood["loss"], "images": len(references), "beam": beam,
            "examples": [{"reference": r, "caption": h} for r, h in list(zip(references, hypotheses))[:5]]}


@register_task
class Captioning(NextTokenTask):
    name = "captioning"
    config = CaptioningConfig
    needs = {"inputs": Inputs.IMAGES, "encoder": True, "decoder": True}
    metrics = {"valid_loss": True, "valid_ppl": True, "exact_match": False}
    commands = ("caption", "evaluate")
    sets = ("image_height", "image_width", "channels", "vocab_size", "pad_id")
    tokenizers = ("tgt",)

    @classmethod
    def prepare(cls, cfg: CaptioningConfig, batching: Batching, tokenizers: Tokenizers | None = None,
                state: dict[str, Any] | None = None) -> CaptionData:
        splits, tokenizers, standardise = captioned_splits(cfg, tokenizers, state)
        return CaptionData(splits=splits, tokenizers=tokenizers, standardise=standardise,
                           batch_size=batching.batch_size, max_caption_len=cfg.max_caption_len, seed=batching.seed)

    @classmethod
    def saved_state(cls, data: CaptionData) -> dict[str, Any]:
        """The images' (H, W, C) and the training split's pixel statistics."""
        channels_, height, width = data.image_shape
        return {"shape": [height, width, channels_], "mean": data.standardise.mean, "std": data.standardise.std}

    @classmethod
    def model_fields(cls, cfg: CaptioningConfig, data: CaptionData) -> dict[str, Any]:
        channels_, height, width = data.image_shape
        return {"image_height": height, "image_width": width, "channels": channels_,
                "vocab_size": data.tokenizers["tgt"].vocab_size, "pad_id": PAD}

    @classmethod
    def planned_model_fields(cls, cfg: CaptioningConfig, vocab_size: int) -> dict[str, Any]:
        height, width, channels_ = planned_shape(cfg)
        return {"image_height": height, "image_width": width, "channels": channels_, "vocab_size": vocab_size,
                "pad_id": PAD}

    @classmethod
    def validate(cls, model: nn.Module, data: CaptionData, device: torch.device, amp: Amp, n_decoded: int,
                 split: str = "valid") -> dict[str, float]:
        """Loss and perplexity, and the exact match of ``n_decoded`` greedy captions."""
        result = super().validate(model, data, device, amp, n_decoded, split)
        if n_decoded:
            part = data.splits[split]
            images = data.standardise(part.images[:n_decoded])
            hypotheses = [c[0][0] for c in caption_images(model, data.tokenizers["tgt"], images, data.max_caption_len)]
            result["exact_match"] = exact_match(hypotheses, part.captions[:n_decoded])
        return result

    @classmethod
    def analysis_pass(cls, model: nn.Module, batch: CaptionBatch) -> dict[str, Tensor]:
        memory, valid = model.encode(batch.src)
        model.decode(batch.tgt_in, memory, valid)
        return {"encoder": valid, "decoder": batch.tgt_in != PAD}

    @classmethod
    def evaluate_split(cls, model: nn.Module, data: CaptionData, split: str) -> dict[str, Any]:
        """Greedy captions of a split of the run's data, scored (:func:`caption_record`)."""
        part = data.splits[split]
        return caption_record(model, data.tokenizers["tgt"], data.standardise(part.images), part.captions,
                              data.max_caption_len)

    @classmethod
    def evaluate_file(cls, model: nn.Module, cfg: CaptioningConfig, tokenizers: Tokenizers, state: dict[str, Any],
                      path: str) -> dict[str, Any]:
        """Greedy captions of a captions file's images, read as the run's training images were, scored."""
        shape = tuple(state["shape"])
        pixels, captions = read_captioned(path, colour_of(shape), cfg.resize or shape[:2])
        images = Standardise(state["mean"], state["std"])(as_tensor(pixels))
        return caption_record(model, tokenizers["tgt"], images, captions, cfg.max_caption_len)

    @classmethod
    def report(cls, result: dict[str, Any], source: str) -> list[str]:
        search = "greedy" if result["beam"] == 1 else f"beam {result['beam']}"
        lines = [f"exact match  {result['exact_match']:.2%}   BLEU  {result['bleu']:.2f}   perplexity of the references  "
                 f"{result['ppl']:.3f}   ({result['images']} images, {source}, {search})",
                 f"BLEU signature  {result['bleu_signature']}"]
        return lines + [f"  {e['caption']}   (reference: {e['reference']})" for e in result["examples"]]

    @classmethod
    def describe(cls, data: CaptionData) -> str:
        sizes = ", ".join(f"{name} {len(split):,}" for name, split in data.splits.items())
        channels_, height, width = data.image_shape
        return f"captioned images {width}x{height}x{channels_}: {sizes}; vocabulary {data.tokenizers['tgt'].vocab_size}"


def planned_shape(cfg: CaptioningConfig) -> tuple[int, int, int]:
    """(H, W, C) of the images ``cfg`` will give, before reading them all."""
    if cfg.dataset is not None:
        return cfg.image_size, cfg.image_size, 3
    channels_ = 1 if cfg.colour == "grey" else 3
    if cfg.resize is not None:
        return cfg.resize, cfg.resize, channels_
    first = scenes.read_captions_file(cfg.train)[0][0]
    return read_image(first, cfg.colour, None).shape


def read_input_images(paths: list[str], run: Any) -> Tensor:
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
            print(f"note: {path}: {image.shape[1]}x{image.shape[0]} pixels, resized to the {shape[1]}x{shape[0]} the "
                  f"model reads", file=sys.stderr)
            image = read_image(path, colour_of(shape), shape[:2])
        pixels.append(image)
    return Standardise(state["mean"], state["std"])(as_tensor(np.stack(pixels)))

