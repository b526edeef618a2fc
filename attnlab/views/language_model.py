"""A language model run's views: the explorer's continuation of the typed prompt, greedy or sampled,
with the maps over prompt and continuation; `inspect`'s maps of one pass over the text."""

from __future__ import annotations

from typing import Any

import torch

from attnlab.analysis.inspect import inspect_sequence
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.language_model import LanguageModel
from attnlab.views.limits import LIMITS, Refused
from attnlab.views.session import Session, attention_maps, picked
from attnlab.views.view import Inspection, Page, register_view, validation_start


@register_view(LanguageModel)
class LanguageModelView:
    page = Page(
        fields={"max_new_tokens": 20, "sample": False, "temperature": 1.0, "seed": 0},
        output="continuation",
        steps="continuation",
    )

    def example(self, run: RunDir, tokenizers: dict[str, Any]) -> str | None:
        """The start of the first non-empty line of the validation text."""
        first = validation_start(run)
        if first is None:
            return None
        lines = tokenizers["tgt"].decode(first.tolist()).splitlines()  # a character LM's text runs across lines
        return next((line.strip() for line in lines if line.strip()), None)

    def answer(
        self, session: Session, text: str, max_new_tokens: int, sample: bool, temperature: float, seed: int
    ) -> dict[str, Any]:
        if not 0 <= max_new_tokens <= LIMITS.max_new_tokens:
            raise Refused(f"max_new_tokens must be between 0 and {LIMITS.max_new_tokens} (got {max_new_tokens})")
        if temperature <= 0:
            raise Refused(f"temperature must be > 0 (got {temperature})")
        prompt = session.encode(text, "tgt", session.max_len)
        if session.max_len is not None:  # the maps cover prompt and continuation: no sliding window
            max_new_tokens = min(max_new_tokens, session.max_len - len(prompt))
        new = session.continuation(prompt, max_new_tokens, sample, temperature, seed)
        ids = torch.tensor([prompt + new], device=session.device)  # (1, T)
        records, next_logprobs = session.teacher_forced(None, ids)
        logprobs = picked(next_logprobs, len(prompt) - 1, new)  # position t predicts token t + 1
        tok = session.tokenizers["tgt"]
        labels = tok.id_tokens(ids[0].tolist())
        return {
            "outputs": [{"text": tok.decode(new), "tokens": tok.id_tokens(new), "logprob": sum(logprobs)}],
            "chosen": 0,
            "prompt_tokens": labels[: len(prompt)],
            "steps": [{"token": token, "logprob": lp} for token, lp in zip(labels[len(prompt) :], logprobs)],
            "attention": attention_maps(records, lambda r: (labels, labels)),
        }

    def inspect(self, inspection: Inspection) -> dict[str, Any]:
        i = inspection
        i.refuse_question()
        return inspect_sequence(i.run.path, i.model, i.tokenizers, i.cfg, i.text, i.target, i.beam, i.figures)
