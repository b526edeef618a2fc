"""A classifier of sound's views: `inspect`'s prediction, attention maps and, for a model whose tokens
tile the spectrogram, the summary's attention drawn on it (analysis/inspect_audio.py)."""

from __future__ import annotations

from typing import Any

from attnlab.analysis.inspect_audio import inspect_sound
from attnlab.tasks.audio_classification import AudioClassification
from attnlab.views.view import Inspection, register_view


@register_view(AudioClassification)
class AudioClassificationView:
    def inspect(self, inspection: Inspection) -> dict[str, Any]:
        i = inspection
        i.refuse_question()
        i.refuse_target("a classifier of sound reads --src AUDIO alone")
        return inspect_sound(i.run, i.model, i.cfg, i.text, i.figures)
