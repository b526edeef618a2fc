"""Scenes: a generated vision-and-language data set in the spirit of SCAN (Lake and Baroni 2018),
for images. No download; the same scenes for a seed on any machine (with the pinned Pillow).

A scene is 1 to ``max_objects`` objects on a 3 x 3 grid of cells of a square image (32 x 32
pixels by default, black background), at most one object per cell. An object has a ``shape``
(circle, square, triangle), a ``colour`` (red, green, blue, yellow) and a ``size`` (small,
large), and is drawn with Pillow's ImageDraw, centred in its cell. Optional noise: each pixel
value plus N(0, noise^2), rounded and clipped to 0-255.

Its caption comes from a small grammar: the objects from left to right (top to bottom within a
column), each "a SIZE COLOUR SHAPE", joined by where the next one is: "left of" (a column further
right) or "above" (the same column, lower down), e.g. "a small red circle left of a large blue
square above a small green triangle". The caption is a function of the image, so a captioner can
be exactly right. Its questions: "how many SHAPEs?" for every shape (0-3), "what colour is the
SHAPE?" for each shape seen once, "what shape is the COLOUR object?" for each colour seen once.

Splits: ``train``, ``valid`` and ``test`` draw every object's (colour, shape) from the
combinations not ``held_out`` (by default every red triangle), so none of them ever shows one;
``compositional`` scenes each hold at least one held-out combination (the first object; the
others are drawn from every combination), whose colour and shape training has seen, only never
together: a test of generalisation like SCAN's add-primitive split. The in-distribution ``test``
is drawn as training is.

Randomness: each split draws from its own ``random.Random`` seeded by the text
"scenes:SEED:SPLIT" (Python seeds from a str through SHA-512: the same on every platform), and the
noise of scene i from numpy's PCG64 seeded by (SEED, split index, i).

Also :func:`read_captions_file`: a user's ``image TAB caption`` lines, the image named relative to
the captions file's folder.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from attnlab.data.corpora import read_lines
from attnlab.errors import DataError

SHAPES = ("circle", "square", "triangle")
PALETTE = {"red": (220, 50, 50), "green": (50, 180, 60), "blue": (50, 90, 230), "yellow": (230, 210, 50)}
SIZES = {"small": 3 / 32, "large": 5 / 32}  # the radius, as a fraction of the image's side
GRID = 3  # cells across and down
SPLITS = ("train", "valid", "test", "compositional")
HELD_OUT = ("red triangle",)


@dataclass(frozen=True)
class SceneObject:
    """One object, in grid cell (row, column)."""

    shape: str
    colour: str
    size: str
    row: int
    column: int

    @property
    def phrase(self) -> str:
        return f"a {self.size} {self.colour} {self.shape}"

    @property
    def combination(self) -> str:
        """'COLOUR SHAPE', what a compositional split holds out."""
        return f"{self.colour} {self.shape}"


@dataclass(frozen=True)
class Scene:
    """A scene's objects (left to right, top to bottom within a column) and its pixels (H, W, 3) uint8."""

    objects: tuple[SceneObject, ...]
    pixels: np.ndarray

    @property
    def caption(self) -> str:
        words = [self.objects[0].phrase]
        for before, after in zip(self.objects, self.objects[1:]):
            words.append(f"{'left of' if after.column > before.column else 'above'} {after.phrase}")
        return " ".join(words)

    @property
    def questions(self) -> list[tuple[str, str]]:
        """(question, answer) pairs, in a fixed order."""
        shapes = [o.shape for o in self.objects]
        colours = [o.colour for o in self.objects]
        pairs = [(f"how many {shape}s?", str(shapes.count(shape))) for shape in SHAPES]
        pairs += [(f"what colour is the {o.shape}?", o.colour) for o in self.objects if shapes.count(o.shape) == 1]
        pairs += [
            (f"what shape is the {o.colour} object?", o.shape) for o in self.objects if colours.count(o.colour) == 1
        ]
        return pairs


def check_held_out(held_out: Iterable[str]) -> tuple[str, ...]:
    """Each 'COLOUR SHAPE' named, checked; a ValueError names the first that is not one."""
    combinations = {f"{c} {s}" for c in PALETTE for s in SHAPES}
    for name in held_out:
        if name not in combinations:
            raise ValueError(
                f"'{name}' is not a 'COLOUR SHAPE' (colours {', '.join(PALETTE)}; shapes {', '.join(SHAPES)})"
            )
    return tuple(held_out)


def cell_centre(index: int, image_size: int) -> int:
    """The pixel at the middle of cell ``index`` (0 .. GRID - 1) along a side of ``image_size``."""
    return round(image_size * (2 * index + 1) / (2 * GRID))


def draw(objects: tuple[SceneObject, ...], image_size: int) -> np.ndarray:
    """The objects on a black square of ``image_size`` pixels -> (H, W, 3) uint8."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (image_size, image_size))
    pen = ImageDraw.Draw(image)
    for o in objects:
        x, y = cell_centre(o.column, image_size), cell_centre(o.row, image_size)
        r = round(SIZES[o.size] * image_size)
        box, fill = [x - r, y - r, x + r, y + r], PALETTE[o.colour]
        if o.shape == "circle":
            pen.ellipse(box, fill=fill)
        elif o.shape == "square":
            pen.rectangle(box, fill=fill)
        else:
            pen.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fill)
    return np.asarray(image, dtype=np.uint8)


def noisy(pixels: np.ndarray, noise: float, seed: tuple[int, ...]) -> np.ndarray:
    """``pixels`` plus N(0, noise^2) per value, rounded and clipped to 0-255 (unchanged at noise 0)."""
    if noise == 0:
        return pixels
    rng = np.random.Generator(np.random.PCG64(seed))
    return np.clip(np.rint(pixels + rng.normal(0.0, noise, pixels.shape)), 0, 255).astype(np.uint8)


def generate(
    split: str,
    n: int,
    seed: int = 0,
    held_out: Iterable[str] = HELD_OUT,
    image_size: int = 32,
    noise: float = 0.0,
    max_objects: int = 3,
) -> list[Scene]:
    """``n`` scenes of ``split`` (one of SPLITS), as the module docstring says."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)} (got {split!r})")
    if not 1 <= max_objects <= GRID * GRID:
        raise ValueError(f"max_objects must be between 1 and {GRID * GRID} (got {max_objects})")
    held = set(check_held_out(held_out))
    every = [(c, s) for c in PALETTE for s in SHAPES]
    seen = [(c, s) for c, s in every if f"{c} {s}" not in held]
    forced = [(c, s) for c, s in every if f"{c} {s}" in held]
    if split == "compositional" and not forced:
        raise ValueError("the compositional split needs at least one held-out combination")
    rng = random.Random(f"scenes:{seed}:{split}")
    scenes = []
    for i in range(n):
        k = rng.randint(1, max_objects)
        cells = rng.sample(range(GRID * GRID), k)
        kinds = [
            rng.choice(forced if split == "compositional" and j == 0 else every if split == "compositional" else seen)
            for j in range(k)
        ]
        objects = tuple(
            sorted(
                (
                    SceneObject(shape, colour, rng.choice(tuple(SIZES)), cell // GRID, cell % GRID)
                    for (colour, shape), cell in zip(kinds, cells)
                ),
                key=lambda o: (o.column, o.row),
            )
        )
        pixels = noisy(draw(objects, image_size), noise, (seed, SPLITS.index(split), i))
        scenes.append(Scene(objects, pixels))
    return scenes


def digest(scenes: Iterable[Scene]) -> str:
    """sha256 over each scene's pixel bytes and caption: the data set's fingerprint."""
    h = hashlib.sha256()
    for scene in scenes:
        h.update(scene.pixels.tobytes())
        h.update(scene.caption.encode() + b"\n")
    return h.hexdigest()


def read_captions_file(path: str | Path) -> list[tuple[Path, str]]:
    """``image TAB caption`` lines -> (image path, caption); an image is named relative to the
    captions file's folder. A line without a tab, with an empty caption, or naming a missing image
    is refused as FILE:LINE (the images are decoded by whoever reads them)."""
    folder = Path(path).parent
    pairs = []
    for n, line in enumerate(read_lines(path), start=1):
        name, tab, caption = line.partition("\t")
        if not tab:
            raise DataError(f"{path}:{n}: expected 'image TAB caption', found no tab")
        if not caption.strip() or not name.strip():
            raise DataError(
                f"{path}:{n}: expected 'image TAB caption', found an empty "
                f"{'image name' if not name.strip() else 'caption'}"
            )
        image = folder / name.strip()
        if not image.is_file():
            raise DataError(f"{path}:{n}: no image '{name.strip()}' in {folder}")
        pairs.append((image, caption.strip()))
    return pairs
