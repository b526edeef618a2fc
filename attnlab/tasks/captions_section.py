"""The data section of captioned images: what such a section offers (CaptionedSection:
captioning's and contrastive's, each composing the parts images, scenes, splits and text and, written
flat, the captions files and Captions: max_caption_len), its checks (check_captioned,
check_captioned_trainable) and captioning's section (CaptioningConfig)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from attnlab.config import TypedConfig, at_least, flattened
from attnlab.errors import ConfigError
from attnlab.tasks.parts import SPLIT_FILES, Files, ImageSource, Splits, Text
from attnlab.tasks.scene_splits import SCENE_SPLITS, SCENE_SPLITS_READ, Scenes
from attnlab.tasks.task import TaskConfig

BUILT_IN = ("scenes",)


@dataclass(frozen=True)
class Captions(TypedConfig):
    """How long a caption may be: ``max_caption_len``, the most tokens of one (a longer one is refused,
    naming its file and line; decoding stops there too). Written in the data section itself
    (``data.max_caption_len``: a task composes this part with config.flattened, giving its own default)."""

    section: ClassVar[str] = "data"

    max_caption_len: int

    def check(self) -> None:
        at_least("max_caption_len", self.max_caption_len, 1)


class CaptionedSection(Protocol):
    """What a data section of captioned images offers (captioning's, contrastive's): each composes
    the parts ``images``, ``scenes``, ``splits``, ``text``, the captions ``files`` and ``captions``
    beside its own fields; tasks/captions.py's functions read it."""

    @property
    def images(self) -> ImageSource: ...
    @property
    def scenes(self) -> Scenes: ...
    @property
    def splits(self) -> Splits: ...
    @property
    def text(self) -> Text: ...
    @property
    def files(self) -> Files: ...
    @property
    def captions(self) -> Captions: ...


def check_captioned(cfg: CaptionedSection, task: str) -> None:
    """The checks of a section of captioned images: the scenes, or captions files, not both."""
    cfg.splits.read_by(task, SCENE_SPLITS_READ)
    cfg.images.built_in(BUILT_IN)
    if cfg.images.dataset is not None:
        given = [name for name, _ in cfg.files.given()]
        if given:
            raise ConfigError(
                f"dataset '{cfg.images.dataset}' brings its own splits and images; drop {', '.join(given)}"
            )
        cfg.scenes.check_drawn(cfg.splits)
    else:
        cfg.splits.given("n_valid")


def check_captioned_trainable(cfg: CaptionedSection, task: str) -> None:
    if cfg.images.dataset is None and cfg.files.train is None:
        raise ConfigError(
            f"data.task '{task}' needs 'images.dataset' (scenes) or 'train' (a captions file: image TAB caption lines)"
        )


@dataclass(frozen=True)
class CaptioningConfig(TaskConfig):
    """``images: {dataset: scenes}`` (splits train, valid, test and compositional, drawn as
    ``scenes`` says with ``splits``' sizes and seed: tasks/scene_splits.py), or ``train`` (and
    optionally ``valid``, ``test``): captions files, their images read as ``images`` says (colour,
    resize: tasks/parts.py); without ``valid``, the last ``splits.n_valid`` of ``train`` validate.
    The captions are tokenised as ``text`` says. ``max_caption_len`` (Captions, written flat): the most
    tokens of a caption (a longer one is refused, naming its file and line); decoding stops there too."""

    images: ImageSource = ImageSource()
    scenes: Scenes = Scenes()
    splits: Splits = SCENE_SPLITS
    text: Text = Text()
    files: Files = flattened(Files(), SPLIT_FILES)
    captions: Captions = flattened(Captions(max_caption_len=32))

    splits_read = SCENE_SPLITS_READ

    def check(self) -> None:
        check_captioned(self, self.chosen_name())

    def check_trainable(self) -> None:
        check_captioned_trainable(self, self.task.name)

    @property
    def longest_sequence(self) -> int:
        return self.captions.max_caption_len + 1  # BOS + caption, or caption + EOS

    @property
    def in_memory(self) -> bool:
        return self.images.dataset is not None
