"""A classifier of sound's views: the explorer's class probabilities and attention maps for an uploaded
recording (or a file on the server), read as `predict` reads it (cut or padded to the clip), with its
spectrogram, over which the page draws what the summary attends to, where the model's tokens tile it;
`inspect`'s prediction, maps and figures on the spectrogram (analysis/inspect_audio.py)."""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F

from attnlab.analysis.capture import capture_attention
from attnlab.analysis.inspect_audio import inspect_sound, on_spectrogram, spectrogram_tokens
from attnlab.nn.interfaces import Classifier, SpectrogramTokens
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.audio_classification import AudioClassification
from attnlab.views.session import Session, attention_maps
from attnlab.views.view import Inspection, Page, register_view


@register_view(AudioClassification)
class AudioClassificationView:
    page = Page(fields={"audio": ""}, audio=True)

    def example(self, run: RunDir, tokenizers: dict[str, Any]) -> str | None:
        return None

    def answer(self, session: Session, text: str, audio: str) -> dict[str, Any]:
        model = session.model
        waves = session.audio(text, audio)  # (1, S), S at most the clip
        lengths = torch.tensor([waves.shape[1]], device=session.device)
        waves = F.pad(waves, (0, session.shape.need("samples") - waves.shape[1]))  # as predict pads it
        with capture_attention(model) as captured:
            logits = cast(Classifier, model).classify(waves, lengths)  # a classifier of sound
        records = captured.last()
        T = next(iter(records.values())).probs.shape[-1]
        labels = [str(t) for t in range(T)]
        result = {
            "source_tokens": labels,
            "attention": attention_maps(records, lambda r: (labels, labels)),
            **session.probabilities(logits[0]),
        }
        if isinstance(model, SpectrogramTokens):
            image, grid = spectrogram_tokens(model, waves, lengths)
            over_tokens = cast(Any, model).summary.attention_over_patches  # (..., T, T) -> (..., N)
            drawn = {  # (H, N) over the grid, row-major, its rows in the picture's order (the low bands last)
                r.module: torch.unflatten(over_tokens(r.probs[0]), -1, grid).flip(-2).flatten(-2)
                for r in records.values()
            }
            result |= {
                "picture": on_spectrogram(image).tolist(),
                "grid": list(grid),
                "summary": [{"module": m["module"], "probs": drawn[m["module"]].tolist()} for m in result["attention"]],
            }
        return result

    def inspect(self, inspection: Inspection) -> dict[str, Any]:
        i = inspection
        i.refuse_question()
        i.refuse_target("a classifier of sound reads --src AUDIO alone")
        return inspect_sound(i.run, i.model, i.cfg, i.text, i.figures)
