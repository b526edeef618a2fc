"""A single-stream question answerer's views: the explorer's answers to a question about an uploaded
image (or a file on the server), as `ask` gives them, with the maps over the joint sequence
[question; patches] and each layer's text-to-image block (analysis/cross_modal.py), which the page
draws on the picture for each word and the [CLS]; `inspect`'s figures of analysis/cross_modal.py."""

from __future__ import annotations

from typing import Any

import torch

from attnlab.analysis.cross_modal import blocks, cross_modal_pass, inspect_single_stream
from attnlab.nn.single_stream import IMAGE
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.captions import read_input_images
from attnlab.tasks.visual_qa import VisualQA, question_ids
from attnlab.views.limits import Refused
from attnlab.views.session import Session, attention_maps
from attnlab.views.view import Inspection, Page, register_view


@register_view(VisualQA)
class VisualQAView:
    page = Page(fields={"image": "", "question": ""}, image=read_input_images, steps="question")

    def example(self, run: RunDir, tokenizers: dict[str, Any]) -> str | None:
        return None

    def answer(self, session: Session, text: str, image: str, question: str) -> dict[str, Any]:
        """The answers to ``question`` about the image; the maps over the joint sequence, and each
        layer's text-to-image block (H, T, N), rows the [CLS] and the words."""
        if not question.strip():
            raise Refused('the question is empty; ask something about the image, e.g. "how many circles?"')
        tokenizer, longest = session.tokenizers["src"], session.data_cfg.max_question_len
        session.encode(question, "src", longest)  # refused: nothing known, or more tokens than the model reads
        assert self.page.image is not None  # the page reads an image
        images, picture = session.image(self.page.image, text, image)
        ids: list[list[int]] | torch.Tensor = question_ids(tokenizer, [question], longest, "the question")
        ids = torch.tensor(ids, device=session.device)  # (1, T)
        logits, records, modality = cross_modal_pass(session.model, images.to(session.device), ids)
        words = ["[CLS]", *tokenizer.id_tokens(ids[0, 1:].tolist())]  # <bos> is read as [CLS]
        patches = session.cfg.patches.labels(session.shape)[
            : int((modality == IMAGE).sum())
        ]  # none: the text-only baseline
        labels = words + patches  # the joint sequence: the question, then the patches
        to_image = [
            {
                "module": r.module,
                "stack": r.stack,
                "layer": r.layer,
                "kind": "text-to-image",
                "rows": words,
                "cols": patches,
                "probs": blocks(r.probs[0], modality)["text_to_image"].tolist(),
            }
            for r in sorted(records.values(), key=lambda r: r.layer)
        ]  # (H, T, N) each
        return {
            "question_tokens": words,
            "source_tokens": labels,
            "grid": list(session.cfg.patches.grid(session.shape)),
            "picture": picture,
            "attention": attention_maps(records, lambda r: (labels, labels)),
            "text_to_image": to_image,
            **session.probabilities(logits),
        }

    def inspect(self, inspection: Inspection) -> dict[str, Any]:
        i = inspection
        i.refuse_target("a single-stream model reads --src IMAGE --question")
        return inspect_single_stream(i.run, i.model, i.cfg, i.text, i.question, i.figures)
