"""The sizes of a model that its data decides (issue 61): one :class:`DataShape`, handed to the
family's builder beside its config, ``build(cfg, shape)``, never merged into the model section.

A task gives the shape of its data (``Task.data_shape``): before the data is read, what its config
alone tells (an image task's resize, a forecaster's lengths; a vocabulary is None until its tokenizer
is fitted), and with the prepared data, every size. A run keeps the shape it was built with in
``shape.json`` beside config.yaml (runs/run_dir.py), so that loading it needs no data.

Each family reads the sizes it needs (:meth:`DataShape.need`): a size it needs and its data does not
give is refused in one line, naming the size and the family.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from attnlab.errors import ConfigError

PAD_ID = 0  # <pad> of data/tokenizers.py (a layer this one does not import)
LEAST = {"pad_id": 0, "n_classes": 2}  # the least value of a size; the others' is 1


@dataclass(frozen=True)
class DataShape:
    """The data's sizes, each None where this data has none (an image has no vocabulary).

    Tokens: ``vocab_size``, the (target) vocabulary; ``src_vocab_size``, the source's where it has one of
    its own (None: ``vocab_size``); ``pad_id``, the padding token's id. Images: ``channels``,
    ``image_height``, ``image_width``. Series: ``n_channels`` (columns), ``input_length`` (steps read),
    ``horizon`` (steps forecast). ``n_classes``: a classifier's classes; ``n_features``: a graph node's
    features; ``segment_length``: the segments a text is read in (Transformer-XL); ``segments``: the
    segments of an input (2 for sentence pairs; None: as the model section's ``n_segments`` says).
    Sound (models/audio.py): ``sample_rate``, the waveforms' rate in Hz; ``samples``, the longest
    clip in samples (every clip is padded or cut to it)."""

    vocab_size: int | None = None
    src_vocab_size: int | None = None
    pad_id: int = PAD_ID
    channels: int | None = None
    image_height: int | None = None
    image_width: int | None = None
    n_channels: int | None = None
    input_length: int | None = None
    horizon: int | None = None
    n_classes: int | None = None
    n_features: int | None = None
    segment_length: int | None = None
    segments: int | None = None
    sample_rate: int | None = None
    samples: int | None = None

    def __post_init__(self) -> None:
        """Whole sizes of at least their least (a padding id from 0, a classifier's classes from 2, the rest
        from 1), and a padding id that is a token of every vocabulary: whatever family reads them."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"shape.{f.name} must be an integer (got {value!r})")
            least = LEAST.get(f.name, 1)
            if value is not None and value < least:
                raise ConfigError(f"shape.{f.name} must be at least {least} (got {value})")
        if self.vocab_sizes and not self.pad_id < min(self.vocab_sizes):
            raise ConfigError(
                f"pad_id ({self.pad_id}) must be a token id below the vocabulary size ({min(self.vocab_sizes)})"
            )

    def need(self, name: str, of: str = "the model") -> int:
        """The size ``name``; refused in one line where the data gives none."""
        value = getattr(self, name)
        if value is None:
            raise ConfigError(f"{of} needs {name} from its data, which gives none")
        return int(value)

    @property
    def src_vocab(self) -> int | None:
        """The source vocabulary: its own, or the target's."""
        return self.src_vocab_size if self.src_vocab_size is not None else self.vocab_size

    @property
    def vocab_sizes(self) -> tuple[int, ...]:
        """Every embedding table's size that the data gives (the pad id must be a token of each)."""
        return tuple(v for v in (self.vocab_size, self.src_vocab_size) if v is not None)

    def with_vocabulary(self, size: int) -> "DataShape":
        """The shape with the vocabulary the data has not sized yet (None) taken as ``size``: a plan
        made before the tokenizers are fitted (`attnlab info --vocab-size`, a sweep's budget); a
        source vocabulary of its own, unknown too, is then read as the same size (``src_vocab``)."""
        return dataclasses.replace(self, vocab_size=self.vocab_size if self.vocab_size is not None else size)

    def to_dict(self) -> dict[str, int]:
        """The sizes given, for shape.json."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, data: Any, where: str = "shape") -> "DataShape":
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: must be a mapping of size: value (got {type(data).__name__})")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown size {unknown[0]!r} (one of {', '.join(sorted(known))})")
        try:
            return cls(**data)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None

    @classmethod
    def read(cls, path: Path) -> "DataShape":
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ConfigError(f"{path}: not a shape file ({err})") from None
        return cls.from_dict(data, str(path))

    def to_json(self) -> str:
        """shape.json's text."""
        return json.dumps(self.to_dict(), indent=2) + "\n"


SIZES = frozenset(f.name for f in dataclasses.fields(DataShape))  # the names a model section may not set


def refuse_sizes(names: Iterable[str], how: str = "") -> None:
    """A model section's field (``names``: its keys, or the fields ``--set`` names) that is a size the
    data decides is refused in one line; ``how``: what wrote it ('--set ...')."""
    sized = sorted(SIZES & set(names))
    if sized:
        raise ConfigError(f"{how}model.{sized[0]} is set by the data, not the model section: remove it")
