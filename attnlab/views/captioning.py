"""A captioner's views: the explorer's beam n-best for an uploaded image (or a file on the server),
read as `caption` reads it, with the picture and the patch grid, over which the page draws each
word's cross-attention; `inspect`'s figure of "Show, Attend and Tell" (Xu et al. 2015)."""

from __future__ import annotations

from typing import Any

from attnlab.analysis.inspect_images import inspect_caption
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.captioning import Captioning
from attnlab.tasks.captions import read_input_images
from attnlab.views.session import SEARCH, Session
from attnlab.views.view import Inspection, Page, register_view


@register_view(Captioning)
class CaptioningView:
    page = Page(fields={"image": "", **SEARCH}, image=read_input_images, output="nbest", steps="decoder")

    def example(self, run: RunDir, tokenizers: dict[str, Any]) -> str | None:
        return None

    def answer(
        self, session: Session, text: str, image: str, beam: int, lenpen: float, hypothesis: int
    ) -> dict[str, Any]:
        assert self.page.image is not None  # the page reads an image
        images, picture = session.image(self.page.image, text, image)
        searched = session.searched(
            images.to(session.device),
            session.cfg.patches.labels(session.shape),
            beam,
            lenpen,
            hypothesis,
            session.cfg.positions.max_len - 1,
        )
        return {**searched, "grid": list(session.cfg.patches.grid(session.shape)), "picture": picture}

    def inspect(self, inspection: Inspection) -> dict[str, Any]:
        i = inspection
        i.refuse_question()
        return inspect_caption(i.run, i.model, i.cfg, i.tokenizers["tgt"], i.text, i.target, i.beam, i.figures)
