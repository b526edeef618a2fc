"""The image of an explorer request: an upload (its file's bytes in base64, read from memory) or
a file on the server named by its path (only when the server allows files), read as the run's
task reads its inputs (`predict`'s for an image classifier, `caption`'s for a captioner, `ask`'s for a
question answerer)."""

from __future__ import annotations

import base64
import binascii
import io

import torch
from torch import Tensor

from attnlab.serve.limits import Refused
from attnlab.tasks.captions import read_input_images
from attnlab.tasks.image_classification import read_inputs
from attnlab.runs.run_dir import RunDir

IMAGE_READERS = {"image_classification": read_inputs, "captioning": read_input_images,  # (paths, run) -> (N, C, H, W)
                 "visual_qa": read_input_images}


class Upload(io.BytesIO):
    """An uploaded image's bytes, which Pillow opens as it opens a file; messages name it so."""

    def __str__(self) -> str:
        return "the uploaded image"


def request_image(task: str, run: RunDir, path: str, upload: str, allow_files: bool) -> tuple[Tensor, list]:
    """The file at ``path`` or the base64 ``upload`` (one of them) -> (1, C, H, W) standardised as
    the run's training images, and the (H, W, C) pixels in [0, 1] that the model read."""
    read = IMAGE_READERS[task]
    if path.strip():
        if not allow_files:
            raise Refused("this server reads no files; upload the image, or start it with --allow-files to explore "
                          "image files by path", status=403)
        images = read([path], run)
    else:
        try:
            data = base64.b64decode(upload, validate=True)
        except (binascii.Error, ValueError):
            raise Refused("image must be an image file's bytes in base64") from None
        images = read([Upload(data)], run)  # a DataError names "the uploaded image"
    state = run.read_task_state()
    pixels = images[0] * torch.tensor(state["std"])[:, None, None] + torch.tensor(state["mean"])[:, None, None]
    return images, (pixels.permute(1, 2, 0) / 255).clamp(0, 1).tolist()  # (C, H, W) -> (H, W, C)
