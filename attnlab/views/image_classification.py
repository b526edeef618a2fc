"""An image model's views: the explorer's class probabilities and maps of an uploaded image (or a
file on the server), read as `predict` reads it; `inspect`'s attention of the image's summary over
the patch grid, drawn on the image, and the rollout. An imported image encoder is inspected alone."""

from __future__ import annotations

from typing import Any, cast

from attnlab.analysis.capture import capture_attention
from attnlab.analysis.inspect_images import inspect_image
from attnlab.nn.interfaces import Classifier
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.image_classification import ImageClassification, read_inputs
from attnlab.tasks.image_encoder import ImageEncoder
from attnlab.views.session import Session, attention_maps
from attnlab.views.view import Inspection, Page, register_view


@register_view(ImageEncoder)
class ImageInspection:
    def inspect(self, inspection: Inspection) -> dict[str, Any]:
        i = inspection
        i.refuse_question()
        i.refuse_target("an image model reads --src IMAGE alone")
        return inspect_image(i.run, i.model, i.cfg, i.text, i.figures)


@register_view(ImageClassification)
class ImageClassificationView(ImageInspection):
    page = Page(fields={"image": ""}, image=read_inputs)

    def example(self, run: RunDir, tokenizers: dict[str, Any]) -> str | None:
        return None

    def answer(self, session: Session, text: str, image: str) -> dict[str, Any]:
        assert self.page.image is not None  # the page reads an image
        images, _ = session.image(self.page.image, text, image)
        with capture_attention(session.model) as captured:
            logits = cast(Classifier, session.model).classify(images.to(session.device))  # an image classifier
        records = captured.last()
        patches = session.cfg.patches.labels(session.shape)
        T = next(iter(records.values())).probs.shape[-1]
        labels = ["<cls>"] * (T - len(patches)) + patches  # a class token, where the model has one, comes first
        return {
            "source_tokens": labels,
            "attention": attention_maps(records, lambda r: (labels, labels)),
            **session.probabilities(logits[0]),
        }
