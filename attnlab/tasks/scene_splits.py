"""What a task on the built-in scenes (data/scenes.py) shares: the fields that draw its splits, their
checks, and the drawing, which captioning's and visual question answering's configs inherit."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import at_least
from attnlab.data import scenes
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class SceneSplits:
    """``seed``; the sizes ``n_train`` / ``n_valid`` / ``n_test`` (each test split); ``held_out``
    (comma-separated 'COLOUR SHAPE' combinations kept out of training); ``image_size`` (16 or
    more); ``noise`` (the pixel noise's standard deviation, 0-255 scale); ``max_objects``. A
    dataclass base: each task's config dataclass inherits these fields with their defaults."""

    seed: int = 0
    n_train: int = 4000
    n_valid: int = 200
    n_test: int = 500
    held_out: str = "red triangle"
    image_size: int = 32
    noise: float = 0.0
    max_objects: int = 3

    def check_scenes(self, drawn: bool) -> None:
        """The fields' checks; ``drawn``: the scenes are the data, so the compositional split needs
        a combination held out."""
        try:
            scenes.check_held_out(self.held_combinations)
        except ValueError as err:
            raise ConfigError(f"held_out: {err}") from None
        if drawn and not self.held_combinations:
            raise ConfigError(
                "held_out names no 'COLOUR SHAPE' combination; the compositional split needs at least "
                "one (e.g. 'red triangle')"
            )
        for name in ("n_train", "n_valid", "n_test"):
            at_least(name, getattr(self, name), 1)
        at_least("image_size", self.image_size, 16)
        if not 1 <= self.max_objects <= scenes.GRID**2:
            raise ConfigError(f"max_objects must be between 1 and {scenes.GRID**2} (got {self.max_objects})")
        if self.noise < 0:
            raise ConfigError(f"noise must be >= 0 (got {self.noise})")

    @property
    def held_combinations(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.held_out.split(",") if name.strip())

    def drawn_scenes(self) -> dict[str, list[scenes.Scene]]:
        """The four splits of scenes (data/scenes.py SPLITS)."""
        sizes = {"train": self.n_train, "valid": self.n_valid, "test": self.n_test, "compositional": self.n_test}
        return {
            split: scenes.generate(
                split, n, self.seed, self.held_combinations, self.image_size, self.noise, self.max_objects
            )
            for split, n in sizes.items()
        }
