"""The views of an encoder-only run read for its maps alone (a masked LM, an imported BertModel):
the explorer's maps of the text, read as the task reads input (``a TAB b``: a pair), and
`inspect`'s maps with the attention of the first token, [CLS]."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnlab.analysis.capture import capture_attention
from attnlab.analysis.inspect import inspect_encoder
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.classification import encode_inputs
from attnlab.tasks.encoder import TextEncoder
from attnlab.tasks.masked_lm import MaskedLM
from attnlab.views.limits import Refused
from attnlab.views.session import Session, attention_maps
from attnlab.views.view import Inspection, Page, register_view


@register_view(MaskedLM, TextEncoder)
class EncoderView:
    page = Page()
    predicts = False  # a classifier's view (views/classification.py) adds its class probabilities

    def example(self, run: RunDir, tokenizers: dict[str, Any]) -> str | None:
        return None

    def answer(self, session: Session, text: str) -> dict[str, Any]:
        a, tab, b = text.partition("\t")
        longest = session.data_cfg.truncation.max_len
        [(ids, segments)], cut = encode_inputs(session.tokenizers["src"], [a], [b if tab else None], longest)
        if cut:
            raise Refused(f"the input is longer than the {longest} tokens this model reads", status=413)
        ids_t, segments_t = (torch.tensor([x], device=session.device) for x in (ids, segments))
        labels = session.tokenizers["src"].id_tokens(ids)
        with capture_attention(session.model) as captured:
            logits = self.read(session, ids_t, segments_t)
        return {
            "source_tokens": labels,
            "attention": attention_maps(captured.last(), lambda r: (labels, labels)),
            **self.outputs(session, logits),
        }

    def read(self, session: Session, ids: Tensor, segments: Tensor) -> Tensor:
        """The model's pass over (1, T) ``ids`` and ``segments``."""
        return session.model(ids, segments)

    def outputs(self, session: Session, logits: Tensor) -> dict[str, Any]:
        """What the page lists above the maps: nothing (a masked LM predicts no output here)."""
        return {"outputs": []}

    def inspect(self, inspection: Inspection) -> dict[str, Any]:
        i = inspection
        i.refuse_question()
        i.refuse_target("an encoder reads --src alone")
        return inspect_encoder(i.run, i.model, i.tokenizers["src"], i.text, i.figures, self.predicts)
