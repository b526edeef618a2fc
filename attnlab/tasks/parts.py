"""The parts that data sections compose, each a field with its own checks, so that no two tasks'
configs declare one field: the files its splits are read from (Files, written flat), how its splits
are sized and held out (``data.splits``: Splits), how its images are read (``data.images``:
ImageSource), how its text becomes token ids (``data.text``: Text) and how long a text input may be
(Truncation, written flat: ``data.max_len``). Each task gives its own defaults as the part's
(``splits: Splits = Splits(seed=0, n_train=4000, ...)``) and reads the fields it says."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Iterable, Optional

from attnlab.config import TypedConfig, at_least, one_of
from attnlab.data.images import COLOURS
from attnlab.data.tokenizers import TOKENIZER_KINDS, Tokenizer
from attnlab.errors import ConfigError

SPLIT_FILES = ("train", "valid", "test")  # the files of a task that reads all three, and no format


@dataclass(frozen=True)
class Files(TypedConfig):
    """The files a task's splits are read from, written in the data section itself (``data.format``,
    ``data.train``, ``data.valid``, ``data.test``: a task composes this part with config.flattened,
    naming the fields its section has): ``format``, how they are written, for a task that reads more
    than one (None where the task has one); the paths, taken from the current directory, or a parallel
    corpus's prefix."""

    section: ClassVar[str] = "data"

    format: Optional[str] = None
    train: Optional[str] = None
    valid: Optional[str] = None
    test: Optional[str] = None

    def given(self) -> list[tuple[str, str]]:
        """(split, path) of each file given, in the order train, valid, test."""
        return [(name, path) for name in SPLIT_FILES if (path := getattr(self, name)) is not None]


@dataclass(frozen=True)
class Splits(TypedConfig):
    """How a task's splits are sized and held out: ``seed`` (of the draw, or of the shuffle);
    ``n_train``, ``n_valid``, ``n_test``: the examples of each split (a generator's counts, the
    examples a file's end or a stratified draw gives up for validation, a series' rows);
    ``valid_fraction``, ``test_fraction``: the shares of the data held out instead (a text's end, a
    series' last rows, each class's nodes). A task reads the fields its config's ``splits_read``
    names, and gives its defaults as the part's; the others are None, and one given is refused."""

    section: ClassVar[str] = "data.splits"

    seed: Optional[int] = None
    n_train: Optional[int] = None
    n_valid: Optional[int] = None
    n_test: Optional[int] = None
    valid_fraction: Optional[float] = None
    test_fraction: Optional[float] = None

    def check(self) -> None:
        for name in ("n_train", "n_valid", "n_test"):
            value = getattr(self, name)
            if value is not None:
                at_least(f"splits.{name}", value, 1)
        for name in ("valid_fraction", "test_fraction"):
            value = getattr(self, name)
            if value is not None and not 0.0 < value < 1.0:
                raise ConfigError(f"splits.{name} must be between 0 and 1 (got {value})")
        if self.valid_fraction is not None and self.test_fraction is not None:
            if self.valid_fraction + self.test_fraction >= 1.0:
                raise ConfigError(
                    f"splits.valid_fraction + splits.test_fraction must be < 1, to leave training data (got "
                    f"{self.valid_fraction} + {self.test_fraction})"
                )

    def given(self, *names: str) -> None:
        """Refuse a None among ``names``, the fields the task needs here."""
        for name in names:
            if getattr(self, name) is None:
                raise ConfigError(f"splits.{name} must be given (got null)")

    def read_by(self, task: str, names: tuple[str, ...]) -> None:
        """Refuse a field given that the task ``task``, which reads ``names``, does not read."""
        for f in dataclasses.fields(self):
            if f.name not in names and getattr(self, f.name) is not None:
                raise ConfigError(
                    f"splits.{f.name}: data.task '{task}' does not read it (its splits: {', '.join(names)})"
                )


@dataclass(frozen=True)
class ImageSource(TypedConfig):
    """How a task's images are read: ``dataset``, a built-in data set of the task (digits, scenes; its
    values are the task's to check) in place of files; ``colour`` (rgb, grey: a file's images
    converted by Pillow); ``resize``: every image read from a file resized to resize x resize pixels
    (bilinear), else a folder's images must all be of one size."""

    section: ClassVar[str] = "data.images"

    dataset: Optional[str] = None
    colour: str = "rgb"
    resize: Optional[int] = None

    def check(self) -> None:
        one_of("images.colour", self.colour, COLOURS)
        if self.resize is not None:
            at_least("images.resize", self.resize, 1)

    def built_in(self, names: tuple[str, ...] | list[str]) -> None:
        """A ``dataset`` given must be one of the task's ``names``; it brings its own images, so no resize."""
        if self.dataset is not None:
            one_of("images.dataset", self.dataset, names)
            if self.resize is not None:
                raise ConfigError(
                    f"images.resize is for image files; dataset '{self.dataset}' draws images of one size"
                )


@dataclass(frozen=True)
class Text(TypedConfig):
    """How a task's text becomes token ids: a ``tokenizer`` of that kind (data/tokenizers.py: char,
    word, word_nopunct, bpe, byte_bpe, unigram, wordpiece) fitted on the training split, with at most
    ``vocab_size`` entries (the subword kinds)."""

    section: ClassVar[str] = "data.text"

    tokenizer: str = "word"
    vocab_size: int = 8000

    def check(self) -> None:
        one_of("text.tokenizer", self.tokenizer, TOKENIZER_KINDS)
        at_least("text.vocab_size", self.vocab_size, 1)

    def fitted(self, texts: Iterable[str], with_mask: bool = False) -> Tokenizer:
        """A tokenizer of this kind and size fitted on ``texts``; ``with_mask``: with <mask> (id 4)."""
        return Tokenizer.train(self.tokenizer, texts, self.vocab_size, with_mask)


@dataclass(frozen=True)
class Truncation(TypedConfig):
    """How long a text input may be: ``max_len``, the longest input kept, in tokens, <bos> and <eos>
    included (a longer one is cut, or refused by the encoder's view: views/encoder.py). Written in the
    data section itself (``data.max_len``: a task composes this part with config.flattened, giving its
    own default); a task whose inputs need more room (a sentence pair's third special) checks its own
    minimum beside this one."""

    section: ClassVar[str] = "data"

    max_len: int

    def check(self) -> None:
        at_least("max_len", self.max_len, 3)  # <bos> a token <eos>
