"""Images as data: reading them (an image folder of class folders, torchvision's ImageFolder layout,
read with Pillow; an ``.npz`` file with ``images`` (N, H, W) or (N, H, W, C) and ``labels`` (N,)),
the built-in ``digits``, stratified splits, per-channel standardisation and the training
augmentations (a random crop of the padded image, a horizontal flip). Pixels are (N, H, W, C)
float32 arrays as read, (N, C, H, W) tensors as batched (:func:`as_tensor`).

``digits`` is scikit-learn's ``load_digits`` (1,797 8x8 greyscale images, pixel values 0-16,
scaled to 0-255 as an 8-bit image file has them, 10 classes, bundled with scikit-learn, no
download), split stratified by class with a seed: 360 images for test, then 180 of the remaining
1,437 for validation, 1,257 for training (``sklearn.model_selection.train_test_split(...,
stratify=labels, random_state=seed)``, test first).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.data.sources import no_such_file
from attnlab.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


COLOURS = {"rgb": "RGB", "grey": "L"}  # data.images.colour -> the Pillow mode a folder's images are converted to


Images = tuple[np.ndarray, list[str]]  # pixels (N, H, W, C) float32, and each image's class name


def read_image(path: str | Path, colour: str, resize: int | tuple[int, int] | None) -> np.ndarray:
    """One image file -> (H, W, C) float32 pixels, in ``colour`` (rgb: C = 3, grey: C = 1),
    resized (bilinear) to ``resize`` x ``resize`` or to ``resize`` = (H, W) when given."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            image = opened.convert(COLOURS[colour])
            if resize is not None:
                height, width = (resize, resize) if isinstance(resize, int) else resize
                image = image.resize((width, height), Image.Resampling.BILINEAR)
            pixels = np.asarray(image, dtype=np.float32)
    except FileNotFoundError:
        raise no_such_file(Path(path)) from None
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        raise DataError(f"{path}: not an image that Pillow can decode") from None
    return pixels[..., None] if pixels.ndim == 2 else pixels


def same_size(pixels: list[np.ndarray], paths: list[Path]) -> None:
    """Refuse images of mixed sizes, naming the first that differs from the first image."""
    for image, path in zip(pixels, paths):
        if image.shape != pixels[0].shape:
            (h, w, _), (h0, w0, _) = image.shape, pixels[0].shape
            raise DataError(
                f"{path}: {w}x{h} pixels, but {paths[0]} is {w0}x{h0}; set data.images.resize to read images of mixed sizes"
            )


def read_folder(root: str | Path, colour: str, resize: int | None) -> Images:
    """``root/<class>/<image>``: every image file of every class folder, in sorted order."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: no such folder")
    paths = [
        (path, folder.name)
        for folder in sorted(p for p in root.iterdir() if p.is_dir())
        for path in sorted(folder.iterdir())
        if path.suffix.lower() in IMAGE_SUFFIXES
    ]
    if not paths:
        raise DataError(
            f"{root}: no images in class folders (expected {root}/<class>/<image>{'|'.join(IMAGE_SUFFIXES[:3])})"
        )
    pixels = [read_image(path, colour, resize) for path, _ in paths]
    same_size(pixels, [path for path, _ in paths])
    return np.stack(pixels), [label for _, label in paths]


def read_npz(path: str | Path) -> Images:
    """An .npz file with ``images`` (N, H, W) or (N, H, W, C) and ``labels`` (N,)."""
    try:
        with np.load(path, allow_pickle=False) as arrays:
            missing = [key for key in ("images", "labels") if key not in arrays.files]
            if missing:
                raise DataError(
                    f"{path}: no array {' or '.join(map(repr, missing))} (it has {', '.join(arrays.files) or 'none'})"
                )
            images, labels = arrays["images"], arrays["labels"]
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not an .npz file numpy can read ({err})") from None
    if images.ndim not in (3, 4) or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(
            f"{path}: expected images (N, H, W) or (N, H, W, C) and labels (N,), got {images.shape} and {labels.shape}"
        )
    images = images.astype(np.float32)
    return (images[..., None] if images.ndim == 3 else images), [str(label) for label in labels.tolist()]


def read_images(path: str, colour: str, resize: int | None) -> Images:
    """A folder of class folders, or an .npz file."""
    return read_npz(path) if Path(path).suffix == ".npz" else read_folder(path, colour, resize)


def colour_of(shape: list[int] | tuple[int, ...]) -> str:
    """How to read an image for a model of images of ``shape`` (H, W, C): one channel is grey."""
    return "grey" if shape[2] == 1 else "rgb"


def stratified_split(labels: list[str], n_held: int, seed: int, path: str) -> tuple[np.ndarray, np.ndarray]:
    """Indices (kept, held out), ``n_held`` held out in the classes' proportions."""
    from sklearn.model_selection import train_test_split

    try:
        kept, held = train_test_split(np.arange(len(labels)), test_size=n_held, stratify=labels, random_state=seed)
    except ValueError as err:  # too few images, or a class of one
        raise DataError(f"{path}: cannot hold out {n_held} images stratified by class ({err})") from None
    return np.sort(kept), np.sort(held)


def digits(seed: int) -> dict[str, Images]:
    """scikit-learn's 8x8 digits, split as the module docstring says."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images * (255 / 16)).astype(np.float32)[..., None]  # (1797, 8, 8, 1), 0-255 as in an image file
    labels = [str(t) for t in bunch.target]
    rest, test = stratified_split(labels, 360, seed, "digits")
    train, valid = stratified_split([labels[i] for i in rest], 180, seed, "digits")
    train, valid = rest[train], rest[valid]
    return {
        name: (images[index], [labels[i] for i in index])
        for name, index in (("train", train), ("valid", valid), ("test", test))
    }


EXAMPLE_DIGITS = {"seven": "7", "three": "3"}  # docs/tutorials/images.md's examples/digits/seven.png and three.png


def write_example_digits(folder: str | Path) -> list[Path]:
    """The first 7 and the first 3 of the digits' test split (split_seed 0) as 8x8 greyscale PNG
    files in ``folder`` (docs/tutorials/images.md's examples/digits), pixels rounded to 0-255; the paths."""
    from PIL import Image

    images, labels = digits(0)["test"]
    paths = []
    for name, digit in EXAMPLE_DIGITS.items():
        paths.append(Path(folder) / f"{name}.png")
        paths[-1].parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.rint(images[labels.index(digit), :, :, 0]).astype(np.uint8), mode="L").save(paths[-1])
    return paths


def random_crop(images: Tensor, padding: int, generator: torch.Generator) -> Tensor:
    """(B, C, H, W) -> the same size, each image cut at a random offset from it padded with
    ``padding`` zero pixels on every side (a shift by up to ``padding`` pixels)."""
    B, _, H, W = images.shape
    padded = F.pad(images, (padding,) * 4)  # (B, C, H + 2p, W + 2p)
    offsets = torch.randint(0, 2 * padding + 1, (B, 2), generator=generator).tolist()
    return torch.stack([padded[b, :, y : y + H, x : x + W] for b, (y, x) in enumerate(offsets)])


def horizontal_flip(images: Tensor, generator: torch.Generator) -> Tensor:
    """(B, C, H, W): each image mirrored left-right with probability 1/2."""
    flipped = torch.rand(len(images), generator=generator) < 0.5  # (B,)
    return torch.where(flipped[:, None, None, None], images.flip(-1), images)


FLIPS: dict[str, Callable[[Tensor, torch.Generator], Tensor]] = {
    "none": lambda images, generator: images,
    "horizontal": horizontal_flip,
}


@dataclass(frozen=True)
class Standardise:
    """x -> (x - mean_c) / std_c per channel, with the training split's statistics."""

    mean: list[float]
    std: list[float]

    @classmethod
    def fitted(cls, pixels: np.ndarray) -> "Standardise":
        """From (N, H, W, C) training pixels; a constant channel keeps std 1."""
        std = pixels.std(axis=(0, 1, 2))
        return cls(pixels.mean(axis=(0, 1, 2)).tolist(), np.where(std > 0, std, 1.0).tolist())

    def __call__(self, images: Tensor) -> Tensor:
        """(B, C, H, W) pixels -> standardised."""
        return (images - torch.tensor(self.mean)[:, None, None]) / torch.tensor(self.std)[:, None, None]


def as_tensor(pixels: np.ndarray) -> Tensor:
    """(N, H, W, C) -> (N, C, H, W)."""
    return torch.from_numpy(np.ascontiguousarray(pixels)).permute(0, 3, 1, 2).contiguous()


def channels(n: int) -> str:
    return f"{n} channel{'s' * (n != 1)}"
