"""How a task's splits are sized and held out (``data.splits``), a part its data section composes:
``seed`` (of the draw, or of the shuffle), ``n_train`` / ``n_valid`` / ``n_test`` (each split's
examples: a generator's counts, or the lines at a file's end held out for validation). Each task
gives its own defaults as the part's (``splits: Splits = Splits(seed=0, n_train=4000, ...)``) and
reads the fields it says; a field it does not read is None by default."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from attnlab.config import TypedConfig, at_least
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class Splits(TypedConfig):
    """``seed``; ``n_train``, ``n_valid``, ``n_test``: the examples of each split (None: every line
    of a file, or a split the task does not draw or hold out)."""

    section: ClassVar[str] = "data.splits"

    seed: Optional[int] = None
    n_train: Optional[int] = None
    n_valid: Optional[int] = None
    n_test: Optional[int] = None

    def __post_init__(self) -> None:
        self._check_types()
        for name in ("n_train", "n_valid", "n_test"):
            value = getattr(self, name)
            if value is not None:
                at_least(f"splits.{name}", value, 1)

    def given(self, *names: str) -> None:
        """Refuse a None among ``names``, the fields the task reads here."""
        for name in names:
            if getattr(self, name) is None:
                raise ConfigError(f"splits.{name} must be given (got null)")
