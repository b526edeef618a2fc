"""The built-in scenes (data/scenes.py) as a task's data: ``data.scenes``, the part that says how
they are drawn (its fields and checks), and the drawing of the four splits with the sizes and seed
of the task's ``data.splits`` (tasks/parts.py). Captioning's, contrastive's and visual_qa's data
sections compose both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from attnlab.config import TypedConfig, at_least
from attnlab.data import scenes
from attnlab.errors import ConfigError
from attnlab.tasks.parts import Splits

# The scenes' splits: SceneSplits' sizes and seed (the part a scenes task gives as its default)
SCENE_SPLITS = Splits(seed=0, n_train=4000, n_valid=200, n_test=500)
SCENE_SPLITS_READ = ("seed", "n_train", "n_valid", "n_test")  # what a scenes task reads of its splits


@dataclass(frozen=True)
class Scenes(TypedConfig):
    """``held_out`` (comma-separated 'COLOUR SHAPE' combinations kept out of training); ``image_size``
    (16 or more); ``noise`` (the pixel noise's standard deviation, 0-255 scale); ``max_objects``."""

    section: ClassVar[str] = "data.scenes"

    held_out: str = "red triangle"
    image_size: int = 32
    noise: float = 0.0
    max_objects: int = 3

    def check(self) -> None:
        try:
            scenes.check_held_out(self.held_combinations)
        except ValueError as err:
            raise ConfigError(f"scenes.held_out: {err}") from None
        at_least("scenes.image_size", self.image_size, 16)
        if not 1 <= self.max_objects <= scenes.GRID**2:
            raise ConfigError(f"scenes.max_objects must be between 1 and {scenes.GRID**2} (got {self.max_objects})")
        if self.noise < 0:
            raise ConfigError(f"scenes.noise must be >= 0 (got {self.noise})")

    @property
    def held_combinations(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.held_out.split(",") if name.strip())

    def check_drawn(self, splits: Splits) -> None:
        """The scenes are the data: the compositional split needs a combination held out, and
        ``splits`` every size and the seed."""
        if not self.held_combinations:
            raise ConfigError(
                "scenes.held_out names no 'COLOUR SHAPE' combination; the compositional split needs at "
                "least one (e.g. 'red triangle')"
            )
        splits.given("seed", "n_train", "n_valid", "n_test")

    def drawn(self, splits: Splits) -> dict[str, list[scenes.Scene]]:
        """The four splits of scenes (data/scenes.py SPLITS): ``splits``' sizes (the compositional
        split n_test's) and seed."""
        sizes = {"train": splits.n_train, "valid": splits.n_valid, "test": splits.n_test}
        sizes["compositional"] = splits.n_test
        return {
            split: scenes.generate(
                split, n or 0, splits.seed or 0, self.held_combinations, self.image_size, self.noise, self.max_objects
            )
            for split, n in sizes.items()
        }
