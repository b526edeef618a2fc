"""Contrastive image-text training (``data.task: contrastive``), CLIP's: a dual encoder
(``arch: dual_encoder``) learns from captioned images which caption goes with which image, by the
symmetric InfoNCE loss over the in-batch similarity matrix (nn/dual_encoder.py).

The data is captioning's (tasks/captioning.py): the built-in ``scenes`` or captions files, the
images standardised with the training split's statistics, the captions word-tokenised and read
by the text tower as BOS caption EOS. A batch is B (image, caption) pairs in a random order of
the epoch, and its other captions are each image's negatives. The scenes repeat captions (a
scene of one object has one of 24), so a batch often holds a caption twice: those copies are
not negatives of each other's images. The loss treats every text of the batch with the same
tokens as a positive of the image (and every image with that caption as a positive of the
text), the targets spread evenly over them; ``train.batch_size`` must be at least 2, and
``train.label_smoothing`` (0.1 by default, the translation paper's) smooths those targets: set it
to 0 for CLIP's loss, as the recipe does.

Validation: the loss over fixed batches, recall@1 (image -> text and text -> image, averaged)
and the zero-shot accuracy (tasks/retrieval.py). `attnlab evaluate RUN --split NAME` (or
``--data FILE``, a captions file) reports recall@1/5 both ways and the zero-shot accuracy;
`attnlab predict RUN image.png` classifies images zero-shot among the run's ``labels`` (or
``--labels``, named by the run's templates or ``--prompts``).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Any, Optional, cast

import torch
from torch import Tensor, nn

from attnlab.config import flattened
from attnlab.data import scenes
from attnlab.data.batching import moved
from attnlab.data.images import Standardise, as_tensor, colour_of
from attnlab.data.tokenizers import UNK, Tokenizer
from attnlab.errors import ConfigError, UsageError
from attnlab.models.family import Inputs
from attnlab.nn.dual_encoder import symmetric_info_nce
from attnlab.tasks.abilities import Prediction, RunState
from attnlab.tasks.batching import Batching, Tokenizers
from attnlab.tasks.captions import CaptionData, CaptionedImages, CaptionSplit, captioned_splits, read_captioned
from attnlab.tasks.captions_section import Captions, check_captioned, check_captioned_trainable
from attnlab.tasks.image_classification import read_inputs
from attnlab.tasks.parts import SPLIT_FILES, Files, ImageSource, Splits, Text
from attnlab.tasks.retrieval import (
    class_embeddings,
    embed_images,
    retrieval_record,
    text_ids,
    zero_shot_probabilities,
)
from attnlab.tasks.scene_splits import SCENE_SPLITS, SCENE_SPLITS_READ, Scenes
from attnlab.tasks.task import Amp, TaskConfig, register_task

SCENE_TEMPLATES = ("a small {label}", "a large {label}")  # every one-object scene's caption is one of these
FILE_TEMPLATES = ("a {label}",)


def fills(template: str) -> bool:
    """Whether str.format fills ``template`` from a label alone."""
    try:
        template.format(label="x")
    except (KeyError, IndexError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class ContrastiveConfig(TaskConfig):
    """Captioned images as captioning reads them (tasks/captions_section.py: the parts ``images``, ``scenes``,
    ``splits`` and ``text``, the captions files and ``max_caption_len``, written flat), and the zero-shot classes:
    ``labels``, comma-separated class names (the scenes' default: every 'COLOUR SHAPE', held-out ones
    included), and ``prompts``, '|'-separated templates with ``{label}`` where the class name goes
    (the scenes' default 'a small {label}|a large {label}', the wording of their captions; a captions
    file's 'a {label}')."""

    images: ImageSource = ImageSource()
    scenes: Scenes = Scenes()
    splits: Splits = SCENE_SPLITS
    text: Text = Text()
    files: Files = flattened(Files(), SPLIT_FILES)
    captions: Captions = flattened(Captions(max_caption_len=32))
    labels: Optional[str] = None
    prompts: Optional[str] = None

    def check_trainable(self) -> None:
        check_captioned_trainable(self, self.task.name)

    @property
    def in_memory(self) -> bool:
        return self.images.dataset is not None

    splits_read = SCENE_SPLITS_READ

    def check(self) -> None:
        check_captioned(self, self.chosen_name())
        names = self.class_names
        if self.labels is not None and len(names) < 2:
            raise ConfigError(
                f"labels names {len(names)} class{'es' * (len(names) != 1)}; zero-shot classification "
                f"needs at least two (comma-separated)"
            )
        if len(set(names)) < len(names):
            raise ConfigError(f"labels names '{next(n for n in names if names.count(n) > 1)}' twice")
        for template in self.templates:
            if "{label}" not in template or not fills(template):
                raise ConfigError(
                    f"prompts: '{template}' must name the class as {{label}} and hold no other braces "
                    f"(e.g. 'a picture of a {{label}}')"
                )

    @property
    def class_names(self) -> list[str]:
        if self.labels is not None:
            return [name.strip() for name in self.labels.split(",") if name.strip()]
        if self.images.dataset is not None:
            return [f"{colour} {shape}" for colour in scenes.PALETTE for shape in scenes.SHAPES]
        return []

    @property
    def templates(self) -> list[str]:
        if self.prompts is not None:
            return [t.strip() for t in self.prompts.split("|") if t.strip()] or [""]
        return list(SCENE_TEMPLATES if self.images.dataset is not None else FILE_TEMPLATES)

    @property
    def longest_sequence(self) -> int:
        return self.captions.max_caption_len + 2  # BOS caption EOS


@dataclass
class PairBatch:
    """images: (B, C, H, W) standardised; text: (B, T) BOS caption EOS, PAD-padded; pair i is
    (images[i], text[i])."""

    images: Tensor
    text: Tensor

    @property
    def n_targets(self) -> int:
        return len(self.images)  # one loss term per pair

    def to(self, device: torch.device | str) -> "PairBatch":
        return moved(self, device)

    def positives(self) -> Tensor:
        """(B, B): text j describes image i (the same tokens as i's caption)."""
        return (self.text[:, None] == self.text[None]).all(-1)


@dataclass(kw_only=True)
class PairData(CaptionData):
    """Captioning's splits and order of an epoch, batched as (image, caption) pairs; the zero-shot
    classes and their prompt templates."""

    labels: list[str]
    templates: list[str]

    def batches(self, split: CaptionSplit, rows: list[Tensor]) -> list[PairBatch]:
        return [
            PairBatch(self.standardise(split.images[r]), text_ids([split.ids[i] for i in r.tolist()])) for r in rows
        ]


@register_task
class Contrastive(CaptionedImages[PairData, PairBatch]):
    """CLIP-style image-text matching by two towers (data.task: contrastive), scored by loss, recall@1
    and zero-shot accuracy."""

    name = "contrastive"
    config = ContrastiveConfig
    needs = {"inputs": Inputs.IMAGE_TEXT, "encoder": False}  # two towers, no joint reading
    metrics = {"valid_loss": True, "recall_at_1": False, "zero_shot_accuracy": False}
    commands = ("predict", "evaluate")
    counts = "pairs"
    cfg: ContrastiveConfig

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, Any] | None = None
    ) -> PairData:
        if batching.batch_size < 2:
            raise ConfigError(
                f"train.batch_size ({batching.batch_size}) must be at least 2 for data.task "
                f"'contrastive': an image's negatives are the batch's other captions"
            )
        splits, tokenizers, standardise = captioned_splits(self.cfg, tokenizers, state)
        return PairData(
            splits=splits,
            tokenizers=tokenizers,
            standardise=standardise,
            batch_size=batching.batch_size,
            max_caption_len=self.cfg.captions.max_caption_len,
            seed=batching.seed,
            labels=self.cfg.class_names,
            templates=self.cfg.templates,
        )

    def saved_state(self, data: PairData) -> dict[str, Any]:
        """Captioning's (the images' shape and pixel statistics), and the zero-shot classes and prompts."""
        return super().saved_state(data) | {"labels": data.labels, "prompts": data.templates}

    def loss(self, model: nn.Module, batch: PairBatch, label_smoothing: float, amp: Amp) -> tuple[Tensor, Tensor]:
        """The symmetric InfoNCE of each pair, summed over the batch (the trainer divides by B)."""
        with amp():
            logits = model(batch.images, batch.text).float()  # (B, B)
        positives = batch.positives()
        loss = symmetric_info_nce(logits, positives, label_smoothing).sum()
        return loss, symmetric_info_nce(logits.detach(), positives).sum() if label_smoothing else loss.detach()

    @torch.no_grad()
    def validate(
        self, model: nn.Module, data: PairData, device: torch.device, amp: Amp, n_decoded: int, split: str = "valid"
    ) -> dict[str, float]:
        """The loss over the split's fixed batches, the mean recall@1 of the two directions and,
        where a prompt captions some images, the zero-shot accuracy."""
        model.eval()
        total = sum(
            symmetric_info_nce(model(b.images, b.text).float(), b.positives()).sum().item()
            for b in (b.to(device) for b in data.eval_batches(split))
        )
        record = self.evaluate_split(model, data, split)
        scores = {
            "valid_loss": total / len(data.splits[split]),
            "recall_at_1": (record["image_to_text_r1"] + record["text_to_image_r1"]) / 2,
        }
        return scores | ({"zero_shot_accuracy": record["zero_shot_accuracy"]} if "zero_shot_accuracy" in record else {})

    def evaluate_split(self, model: nn.Module, data: PairData, split: str) -> dict[str, Any]:
        """Retrieval and zero-shot scores of a split of the run's data (tasks/retrieval.py)."""
        part = data.splits[split]
        return retrieval_record(
            model,
            cast(Tokenizer, data.tokenizers["tgt"]),  # the task's own role: never None
            data.standardise(part.images),
            part.captions,
            data.labels,
            data.templates,
        )

    def evaluate_file(
        self, model: nn.Module, tokenizers: Tokenizers, state: dict[str, Any], path: str, split: str | None
    ) -> dict[str, Any]:
        """The same on a captions file's images, read as the run's training images were."""
        self.refuse_split(split)
        shape = tuple(state["shape"])
        pixels, captions = read_captioned(path, colour_of(shape), self.cfg.images.resize or shape[:2])
        images = Standardise(state["mean"], state["std"])(as_tensor(pixels))
        tgt = cast(Tokenizer, tokenizers["tgt"])  # the task's own role: never None
        return retrieval_record(model, tgt, images, captions, self.cfg.class_names, self.cfg.templates)

    def report(self, result: dict[str, Any], source: str) -> list[str]:
        lines = [
            f"image -> text  recall@1 {result['image_to_text_r1']:.2%}  recall@5 "
            f"{result['image_to_text_r5']:.2%}   ({result['images']} images, {result['captions']} distinct "
            f"captions, {source})",
            f"text -> image  recall@1 {result['text_to_image_r1']:.2%}  recall@5 {result['text_to_image_r5']:.2%}",
        ]
        if not result["zero_shot_classes"]:
            return lines + ["zero-shot: the run has no classes (data.labels)"]
        if "zero_shot_accuracy" not in result:
            return lines + [
                f"zero-shot: no image is captioned by a prompt of the {result['zero_shot_classes']} classes"
            ]
        lines.append(
            f"zero-shot accuracy  {result['zero_shot_accuracy']:.2%}   ({result['zero_shot_images']} images "
            f"captioned by a prompt, {result['zero_shot_classes']} classes)"
        )
        return lines + [f"  {e['label']} -> {e['predicted']}: {e['images']} images" for e in result["zero_shot_errors"]]

    predict_options = ("labels", "prompts")

    def zero_shot_classes(
        self, run: RunState, labels: str | None = None, prompts: str | None = None
    ) -> tuple[list[str], list[str]]:
        """The class names and prompt templates: ``labels`` and ``prompts`` as the data section
        reads them (checked alike), each by default the run's."""
        cfg = run.read_config()[1]
        given = {name: value for name, value in (("labels", labels), ("prompts", prompts)) if value is not None}
        try:
            cfg = dataclasses.replace(cfg, **given)
        except ConfigError as err:
            raise UsageError(f"--{' / --'.join(given)}: {err}") from None
        read = cast(ContrastiveConfig, cfg)  # the run's data section: this task's
        return read.class_names, read.templates

    def class_names(self, run: RunState, **options: str) -> list[str]:
        return self.zero_shot_classes(run, **options)[0]

    @torch.no_grad()
    def predict(
        self,
        model: nn.Module,
        run: RunState,
        inputs: list[str],
        input_file: str | None,
        batch_size: int,
        labels: str | None = None,
        prompts: str | None = None,
    ) -> list[Prediction]:
        """Each image file classified zero-shot among the classes (the run's, or ``labels``), each
        named by its prompts (the run's templates, or ``prompts``)."""
        if input_file is not None or not inputs:
            raise UsageError("give the images to classify as arguments: attnlab predict RUN image.png [more.png ...]")
        names, templates = self.zero_shot_classes(run, labels, prompts)
        if not names:
            raise UsageError(f"{run.path} has no zero-shot classes of its own (data.labels): give --labels")
        tokenizer = cast(Tokenizer, run.read_tokenizers()["tgt"])  # the task's own role: never None
        unknown = [p for p in (t.format(label=name) for name in names for t in templates) if UNK in tokenizer.encode(p)]
        if unknown:
            print(
                f"note: {len(unknown)} prompts hold words the run's captions never had, read as <unk> (the first: "
                f"'{unknown[0]}')",
                file=sys.stderr,
            )
        images = torch.cat([embed_images(model, chunk) for chunk in torch.split(read_inputs(inputs, run), batch_size)])
        classes = class_embeddings(model, tokenizer, names, templates)
        return list(zip(inputs, zero_shot_probabilities(model, images, classes).tolist()))

    def describe(self, data: PairData) -> str:
        return super().describe(data).replace("captioned images", "image-caption pairs", 1)
