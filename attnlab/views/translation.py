"""A translation run's views: the explorer's beam n-best over the typed sentence, and `inspect`'s
maps of one teacher-forced pass over the reference or the model's own translation."""

from __future__ import annotations

from typing import Any

from attnlab.analysis.inspect import inspect_sequence
from attnlab.data.batching import source_batch
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.translation import Translation
from attnlab.views.session import SEARCH, Session
from attnlab.views.view import Inspection, Page, register_view, validation_start


@register_view(Translation)
class TranslationView:
    page = Page(fields=SEARCH, output="nbest", steps="decoder")

    def example(self, run: RunDir, tokenizers: dict[str, Any]) -> str | None:
        first = validation_start(run)
        return None if first is None else first[0].src

    def answer(self, session: Session, text: str, beam: int, lenpen: float, hypothesis: int) -> dict[str, Any]:
        ids = session.encode(text, "src", None if session.max_len is None else session.max_len - 1)  # -1: EOS
        src = source_batch([ids]).to(session.device)  # (1, S): the source and EOS
        return session.searched(src, session.tokenizers["src"].id_tokens(src[0].tolist()), beam, lenpen, hypothesis)

    def inspect(self, inspection: Inspection) -> dict[str, Any]:
        i = inspection
        i.refuse_question()
        return inspect_sequence(i.run.path, i.model, i.tokenizers, i.cfg, i.text, i.target, i.beam, i.figures)
