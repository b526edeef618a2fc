"""A speech recogniser's views: `inspect`'s spectrogram, attention maps and the transcript's alignment
with time (analysis/inspect_audio.py)."""

from __future__ import annotations

from typing import Any

from attnlab.analysis.inspect_audio import inspect_transcript
from attnlab.tasks.speech_recognition import SpeechRecognition
from attnlab.views.view import Inspection, register_view


@register_view(SpeechRecognition)
class SpeechRecognitionView:
    def inspect(self, inspection: Inspection) -> dict[str, Any]:
        i = inspection
        i.refuse_question()
        return inspect_transcript(i.run, i.model, i.tokenizers["tgt"], i.text, i.target, i.beam, i.figures)
