"""How a speech recogniser learns and is read, by the interface its model offers (tasks/speech_recognition.py
asks :func:`transcriber_of`, found with ``isinstance`` as the tasks' abilities are): an encoder-decoder
(Whisper's shape: nn/speech.py's SpeechRecognizer) by teacher forcing, its transcripts by greedy or beam
search; an encoder read by CTC (nn/speech.py's CTCRecognizer) by the CTC loss (Graves et al. 2006), its
transcripts by CTC's best path or prefix beam search (decode/spec.py's CTC), the same --beam and --nbest
asking for one or the other.

Either way a batch is the zero-padded waveforms as ``src``, BOS + digits as ``tgt_in`` and digits + EOS as
``tgt_out``; CTC reads the digits alone (``tgt_in`` after BOS). Its loss is -log P(y | x), the sum over
every alignment of the frames to the digits, so its perplexity per digit is of the kind of the
encoder-decoder's per token (whose tokens are the digits and EOS).
"""

from __future__ import annotations

import contextlib
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data.batching import Batch
from attnlab.data.tokenizers import PAD
from attnlab.decode.spec import CTC, Beam, Search
from attnlab.eval.likelihood import evaluate, teacher_forced_loss
from attnlab.eval.metrics import perplexity
from attnlab.nn.interfaces import CTCModel, Seq2SeqModel
from attnlab.tasks.task import Amp


class Transcriber(Protocol):
    """What differs between recognisers: the training loss, the references' likelihood, the search."""

    def loss(self, model: nn.Module, batch: Batch, label_smoothing: float, amp: Amp) -> tuple[Tensor, Tensor]: ...

    def likelihood(self, model: nn.Module, batches: list[Batch]) -> dict[str, float]: ...

    def search(self, search: Search) -> Search: ...

    def analysed(self, model: nn.Module, batch: Batch) -> dict[str, Tensor]: ...


class TeacherForcing:
    """An encoder-decoder: the label-smoothed cross-entropy of each next digit given the true prefix."""

    def loss(self, model: nn.Module, batch: Batch, label_smoothing: float, amp: Amp) -> tuple[Tensor, Tensor]:
        return teacher_forced_loss(model, batch, label_smoothing, amp)

    def likelihood(self, model: nn.Module, batches: list[Batch]) -> dict[str, float]:
        return evaluate(model, batches)

    def search(self, search: Search) -> Search:
        return search

    def analysed(self, model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        recogniser = cast(Seq2SeqModel, model)
        memory, valid = recogniser.encode(cast(Tensor, batch.src))
        recogniser.decode(batch.tgt_in, memory, valid)
        return {"encoder": valid, "decoder": batch.tgt_in != PAD}


class ConnectionistTemporal:
    """An encoder read by CTC: -log P(digits | frames) summed over the alignments (label smoothing does not
    apply), decoded by CTC's best path (--beam 1) or prefix beam search (--beam K, --nbest)."""

    def loss(self, model: nn.Module, batch: Batch, label_smoothing: float, amp: Amp) -> tuple[Tensor, Tensor]:
        with amp():
            log_probs, frames = cast(CTCModel, model).ctc_log_probs(cast(Tensor, batch.src))  # (B, T, V), (B,)
        digits = batch.tgt_in[:, 1:]  # (B, L): the digits after BOS, PAD after them
        nll = F.ctc_loss(
            log_probs.float().transpose(0, 1),  # (T, B, V), as torch takes them
            digits[digits != PAD],  # (sum of L_b,): the targets one after another
            frames,
            (digits != PAD).sum(1),
            blank=cast(CTCModel, model).blank,
            reduction="sum",
            zero_infinity=True,  # a string with more digits than frames: no alignment, no gradient
        )
        return nll, nll.detach()

    @torch.no_grad()
    def likelihood(self, model: nn.Module, batches: list[Batch]) -> dict[str, float]:
        model.eval()
        device = next(model.parameters()).device
        nll, n = 0.0, 0
        for batch in batches:
            batch = batch.to(device)
            nll += self.loss(model, batch, 0.0, contextlib.nullcontext)[1].item()
            n += int((batch.tgt_in[:, 1:] != PAD).sum())  # the digits: CTC predicts no EOS
        loss = nll / max(n, 1)
        return {"loss": loss, "ppl": perplexity(loss), "tokens": n}

    def search(self, search: Search) -> Search:
        if isinstance(search, CTC):  # already CTC's
            return search
        if isinstance(search, Beam):
            return CTC(width=search.width, nbest=search.nbest, batch_size=search.batch_size)
        return CTC(batch_size=search.batch_size)

    def analysed(self, model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        _, frames = cast(CTCModel, model).ctc_log_probs(cast(Tensor, batch.src))  # (B,)
        return {"encoder": torch.arange(int(frames.max()), device=frames.device)[None, :] < frames[:, None]}


def transcriber_of(model: nn.Module) -> Transcriber:
    """How ``model`` learns and is read: by CTC if it offers CTC's interface, else as an encoder-decoder."""
    return ConnectionistTemporal() if isinstance(model, CTCModel) else TeacherForcing()
