"""A speech recogniser's views: the explorer's beam n-best for an uploaded recording (or a file on the
server), read as `transcribe` reads it, with its spectrogram, over which the page draws each output
digit's cross-attention (the frame tokens' row); `inspect`'s spectrogram, attention maps and the
transcript's alignment with time (analysis/inspect_audio.py)."""

from __future__ import annotations

from typing import Any, cast

import torch

from attnlab.analysis.inspect_audio import inspect_transcript, on_spectrogram, spectrogram_tokens, token_times
from attnlab.nn.interfaces import CTCModel, SpectrogramTokens
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.speech_recognition import SpeechRecognition
from attnlab.views.limits import Refused
from attnlab.views.session import SEARCH, Session
from attnlab.views.view import Inspection, Page, register_view


@register_view(SpeechRecognition)
class SpeechRecognitionView:
    page = Page(fields={"audio": "", **SEARCH}, audio=True, output="nbest", steps="decoder")

    def example(self, run: RunDir, tokenizers: dict[str, Any]) -> str | None:
        return None

    def answer(
        self, session: Session, text: str, audio: str, beam: int, lenpen: float, hypothesis: int
    ) -> dict[str, Any]:
        model = session.model
        if isinstance(model, CTCModel) or not isinstance(model, SpectrogramTokens):
            raise Refused(
                f"arch '{session.cfg.arch}' is read by CTC, which has no step to attend from: `attnlab transcribe` "
                f"writes its n-best and `attnlab inspect` draws its alignment"
            )
        waves = session.audio(text, audio)  # (1, S)
        with torch.no_grad():  # the spectrogram of what the encoder reads: the clip, or the whole window
            image, grid = spectrogram_tokens(model, *cast(Any, model).clips(waves))  # (n_mels, F), (1, T)
        searched = session.searched(
            waves, token_times(model, grid[1]), beam, lenpen, hypothesis, session.cfg.positions.max_len - 1
        )
        return {**searched, "grid": list(grid), "picture": on_spectrogram(image).tolist()}

    def inspect(self, inspection: Inspection) -> dict[str, Any]:
        i = inspection
        i.refuse_question()
        return inspect_transcript(i.run, i.model, i.tokenizers["tgt"], i.text, i.target, i.beam, i.figures)
