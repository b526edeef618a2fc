"""The shared steps of answering an explorer request, which the views' ``answer`` methods compose:
a loaded run (:class:`Session`) that encodes text, reads an image or a recording from an upload or a
file, runs a
beam search and one teacher-forced pass over its chosen hypothesis, continues a prompt, captures
the attention of one pass, and turns logits into class probabilities; and :func:`attention_maps`,
each module's weights as the API sends them."""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.analysis.capture import AttentionRecord, capture_attention
from attnlab.analysis.heads import head_entropy
from attnlab.data.audio import decode_audio, read_audio
from attnlab.data.tokenizers import BOS, EOS
from attnlab.decode.spec import Beam, Sample
from attnlab.models.shape import DataShape
from attnlab.runs.run_dir import RunDir
from attnlab.views.limits import LIMITS, Refused

SEARCH = {"beam": 4, "lenpen": 0.6, "hypothesis": 0}  # the fields of a page whose outputs a beam search finds
ImageReader = Callable[[list[Any], RunDir], Tensor]  # (paths or uploads, run) -> (N, C, H, W) standardised
Axes = Callable[[AttentionRecord], tuple[list[str], list[str]]]  # a module's (row labels, column labels)


class Upload(io.BytesIO):
    """An uploaded image's bytes, which Pillow opens as it opens a file; messages name it so."""

    def __str__(self) -> str:
        return "the uploaded image"


@dataclass
class Session:
    """One run loaded for the explorer: its model on ``device``, tokenizers by role, model section
    ``cfg``, the data's sizes it was built with ``shape`` and data section ``data_cfg``;
    ``allow_files``: whether a request may name a file."""

    run_dir: RunDir
    model: nn.Module
    tokenizers: dict[str, Any]
    cfg: Any
    shape: DataShape
    data_cfg: Any
    device: torch.device
    allow_files: bool

    @property
    def max_len(self) -> int | None:
        """The longest sequence the model was built for (its ``max_len``), where its family has one."""
        return self.cfg.longest_sequence

    def encode(self, text: str, role: str, room: int | None) -> list[int]:
        """``text`` as token ids, refused when it is empty or longer than ``room`` tokens."""
        ids = self.tokenizers[role].encode(text)
        if not ids:
            raise Refused("the input is empty after tokenisation; give at least one known token")
        if room is not None and len(ids) > room:
            raise Refused(f"the input has {len(ids)} tokens; this model reads at most {room}", status=413)
        return ids

    def image(self, read: ImageReader, path: str, upload: str) -> tuple[Tensor, list[list[list[float]]]]:
        """The file at ``path`` or the base64 ``upload`` (one of them), read by ``read`` -> (1, C, H, W)
        standardised as the run's training images, and the (H, W, C) pixels in [0, 1] the model read."""
        if path.strip():
            if not self.allow_files:
                raise Refused(
                    "this server reads no files; upload the image, or start it with --allow-files to "
                    "explore image files by path",
                    status=403,
                )
            images = read([path], self.run_dir)
        else:
            try:
                data = base64.b64decode(upload, validate=True)
            except (binascii.Error, ValueError):
                raise Refused("image must be an image file's bytes in base64") from None
            images = read([Upload(data)], self.run_dir)  # a DataError names "the uploaded image"
        state = self.run_dir.read_task_state()
        std, mean = (torch.tensor(state[k])[:, None, None] for k in ("std", "mean"))
        pixels = images[0] * std + mean
        return images, (pixels.permute(1, 2, 0) / 255).clamp(0, 1).tolist()  # (C, H, W) -> (H, W, C)

    def audio(self, path: str, upload: str) -> Tensor:
        """The file at ``path`` or the base64 ``upload`` (one of them), read at the run's rate as its
        commands read audio -> (1, S) waveform on the session's device; longer than the model reads:
        refused."""
        rate, samples = self.shape.need("sample_rate"), self.shape.need("samples")
        if path.strip():
            if not self.allow_files:
                raise Refused(
                    "this server reads no files; upload the recording, or start it with --allow-files to "
                    "explore audio files by path",
                    status=403,
                )
            sound = read_audio(path, rate).samples
        else:
            try:
                data = base64.b64decode(upload, validate=True)
            except (binascii.Error, ValueError):
                raise Refused("audio must be an audio file's bytes in base64") from None
            if not data:
                raise Refused("audio is empty: upload a recording")
            sound = decode_audio(io.BytesIO(data), "the uploaded recording", rate).samples
        if len(sound) > samples:
            raise Refused(
                f"the recording is {len(sound) / rate:.2f} s; this model reads at most {samples / rate:g} s", status=413
            )
        return torch.from_numpy(sound)[None].to(self.device)  # (1, S)

    def searched(
        self, src: Tensor, src_labels: list[str], beam: int, lenpen: float, hypothesis: int, max_len: int | None = None
    ) -> dict[str, Any]:
        """The beam's n-best for ``src`` (1, S) ids, or (1, C, H, W) an image, labelled ``src_labels``;
        the maps of one teacher-forced pass over the chosen hypothesis, and each of its tokens' log P."""
        if not 1 <= beam <= LIMITS.max_beam:
            raise Refused(f"beam must be between 1 and {LIMITS.max_beam} (got {beam})")
        if not 0 <= hypothesis < beam:
            raise Refused(f"hypothesis must be between 0 and beam - 1 ({beam - 1}) (got {hypothesis})")
        hyps = Beam(width=beam, lenpen=lenpen, nbest=beam, max_len=max_len).hypotheses(self.model, src)[0]
        index = min(hypothesis, len(hyps) - 1)  # a search may finish fewer than beam hypotheses
        chosen = hyps[index]
        tgt = self.tokenizers["tgt"]
        tgt_in = torch.tensor([[BOS] + chosen.tokens], device=self.device)  # (1, T): the decoder's inputs
        records, next_logprobs = self.teacher_forced(src, tgt_in)
        logprobs = picked(next_logprobs, 0, chosen.tokens + [EOS])
        in_labels = tgt.id_tokens(tgt_in[0].tolist())
        out_labels = tgt.id_tokens(chosen.tokens + [EOS])  # what each decoder position predicts
        axes = {
            ("encoder", "self"): (src_labels, src_labels),
            ("decoder", "self"): (in_labels, in_labels),
            ("decoder", "cross"): (out_labels, src_labels),
        }
        return {
            "outputs": [
                {
                    "text": tgt.decode(h.tokens),
                    "tokens": tgt.id_tokens(h.tokens),
                    "score": h.normalized,
                    "logprob": h.score,
                }
                for h in hyps
            ],
            "chosen": index,
            "source_tokens": src_labels,
            "target_tokens": out_labels,
            "steps": [{"token": token, "logprob": lp} for token, lp in zip(out_labels, logprobs)],
            "attention": attention_maps(records, lambda r: axes[r.stack, r.kind]),
        }

    def continuation(
        self, prompt: list[int], max_new_tokens: int, sampled: bool, temperature: float, seed: int
    ) -> list[int]:
        """The continuation of ``prompt``: the argmax at each step, or drawn from a generator seeded with ``seed``."""
        if max_new_tokens == 0:
            return []
        search = Sample(
            max_len=max_new_tokens, temperature=temperature if sampled else 1.0, top_k=None if sampled else 1, seed=seed
        )
        return search.continue_prompt(self.model, torch.tensor([prompt], device=self.device))[0]

    def teacher_forced(self, src: Tensor | None, inputs: Tensor) -> tuple[dict[str, AttentionRecord], Tensor]:
        """One pass over ``inputs`` (1, T) (and ``src``): every module's weights, and the (T, V)
        log-probabilities of the token after each position."""
        with capture_attention(self.model) as captured:
            logits = self.model(src, inputs) if src is not None else self.model(inputs)  # (1, T, V)
        return captured.last(), logits[0].float().log_softmax(-1)

    def probabilities(self, logits: Tensor) -> dict[str, Any]:
        """A classifier's (n_classes,) logits -> its classes as outputs, most probable first."""
        names = self.run_dir.read_task_state()["labels"]
        p = logits.float().softmax(-1).tolist()
        ranked = sorted(zip(names, p), key=lambda pair: -pair[1])
        return {"outputs": [{"label": label, "probability": prob} for label, prob in ranked], "chosen": 0}


def picked(logprobs: Tensor, first: int, tokens: list[int]) -> list[float]:
    """log P of each of ``tokens``, predicted at positions ``first``, ``first`` + 1, ... of (T, V) ``logprobs``;
    for a search's output they add up to the score it gave."""
    positions = torch.arange(first, first + len(tokens), device=logprobs.device)
    return logprobs[positions, torch.tensor(tokens, dtype=torch.long, device=logprobs.device)].tolist()


def attention_maps(records: dict[str, AttentionRecord], axes: Axes) -> list[dict[str, Any]]:
    """Each module's weights of the one input, for the API: encoder self-attention, then decoder
    self-attention, then cross-attention, each by layer. ``axes(record)`` gives its (row labels,
    column labels); ``probs`` is (H, Tq, Tk) as nested lists, ``entropy`` each head's mean entropy
    over the queries (nats; ``uniform_entropy`` that of a uniform head over the keys)."""
    order = {("encoder", "self"): 0, ("decoder", "self"): 1, ("decoder", "cross"): 2}
    maps = []
    for record in sorted(records.values(), key=lambda r: (order.get((r.stack, r.kind), 3), r.layer)):
        rows, cols = axes(record)
        maps.append(
            {
                "module": record.module,
                "stack": record.stack,
                "layer": record.layer,
                "kind": record.kind,
                "rows": rows,
                "cols": cols,
                "probs": record.probs[0].tolist(),
                "entropy": head_entropy(record.probs).tolist(),
                "uniform_entropy": math.log(record.probs.shape[-1]),
            }
        )
    return maps
