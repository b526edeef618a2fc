"""Translation by a conditional masked language model (Mask-Predict, Ghazvininejad et al. 2019):
translation's data (the same parallel files, tokenizers with <mask>), each target partly masked,
the masked tokens and the target's length learnt; decoded by mask-predict (`translate`, `evaluate`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data.batching import moved, pad_sequences, source_batch
from attnlab.data.tokenizers import MASK, PAD
from attnlab.decode.spec import MaskPredict
from attnlab.eval.metrics import exact_match, perplexity
from attnlab.models.cmlm import MASKED_TOKENS
from attnlab.models.family import unwrapped
from attnlab.nn.losses import label_smoothed_nll
from attnlab.tasks.task import Amp, register_task
from attnlab.tasks.translation import (
    Example,
    ParallelText,
    SentencePairs,
    TranslationConfig,
    decode_split,
)

if TYPE_CHECKING:
    from attnlab.nn.cmlm import ConditionalMaskedLM


@dataclass(frozen=True)
class MaskedTranslationConfig(TranslationConfig):
    """Translation's data section (tasks/translation.py), field for field, under data.task
    'masked_translation' (model.arch 'cmlm'): a class of its own only because a section class names
    the one task it describes (``TaskConfig.task``); it declares no field. Its tokenizers have <mask>."""


@dataclass
class MaskedBatch:
    """src: (B, S) source ids + EOS; inputs: (B, T) the targets, the chosen tokens replaced by
    <mask>; targets: (B, T) the original id where a token was masked, PAD elsewhere; lengths: (B,)
    the targets' lengths N. PAD marks padding."""

    src: Tensor
    inputs: Tensor
    targets: Tensor
    lengths: Tensor

    @property
    def n_targets(self) -> int:
        """Masked tokens: the targets of the token loss."""
        return int((self.targets != PAD).sum())

    def to(self, device: torch.device | str) -> "MaskedBatch":
        return moved(self, device)


def mask_targets(tgt: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """The paper's training masks of (B, T) PAD-padded targets: for each sentence of N tokens,
    n ~ Uniform{1, ..., N}, then n of its N positions uniformly at random. -> (inputs with those
    tokens <mask>, targets: their ids there and PAD elsewhere), (B, T) each."""
    real = tgt != PAD  # (B, T)
    lengths = real.sum(1)  # (B,)
    n = (torch.rand(lengths.shape, generator=generator) * lengths).long() + 1  # (B,): floor(u N) + 1
    draw = torch.rand(tgt.shape, generator=generator).masked_fill(~real, 2.0)  # padding sorts after every real draw
    chosen = draw.argsort(dim=1).argsort(dim=1) < n[:, None]  # (B, T): the n lowest draws of each row
    return tgt.masked_fill(chosen, MASK), torch.where(chosen, tgt, PAD)


@dataclass(kw_only=True)
class MaskedPairs(SentencePairs[MaskedBatch]):
    """Translation's pairs; each batch's masks drawn from its own seed (tasks/task.py batch_seed),
    so a resumed run draws what an uninterrupted one would, and the evaluation batches, made once,
    keep theirs."""

    def collate(self, examples: list[Example], seed: int) -> MaskedBatch:
        tgt = pad_sequences([e.tgt_ids for e in examples])  # (B, T), no BOS or EOS: the length is predicted
        inputs, targets = mask_targets(tgt, torch.Generator().manual_seed(seed))
        return MaskedBatch(source_batch([e.src_ids for e in examples]), inputs, targets, (tgt != PAD).sum(1))


def length_nll(model: nn.Module, length_logits: Tensor, lengths: Tensor) -> Tensor:
    """-sum_b log P(N_b | x_b): the length loss of a batch, float32."""
    cmlm = cast("ConditionalMaskedLM", unwrapped(model))  # the task's model (needs: MASKED_TOKENS)
    return F.cross_entropy(length_logits.float(), cmlm.length_predictor.classes(lengths), reduction="sum")


@register_task
class MaskedTranslation(ParallelText[MaskedPairs, MaskedBatch]):
    """Translation's data, learnt by a conditional masked language model (Ghazvininejad et al.
    2019). The loss of a batch is the label-smoothed cross-entropy of its masked tokens (the others
    count for nothing) plus length_loss_weight times the cross-entropy of its target lengths, both
    summed (the trainer divides by the masked tokens, as fairseq's sample size). Validation: the NLL
    per masked token (``valid_loss``) and its perplexity, the length predictor's accuracy, and
    the exact match of mask-predict's translations (its default settings)."""

    name = "masked_translation"
    config = MaskedTranslationConfig
    needs = {"encoder": True, "decoder": True, "inputs": MASKED_TOKENS}
    metrics = {"valid_loss": True, "valid_ppl": True, "length_accuracy": False, "exact_match": False}
    commands = ("translate", "evaluate")
    layout = MaskedPairs
    with_mask = True

    def loss(self, model: nn.Module, batch: MaskedBatch, label_smoothing: float, amp: Amp) -> tuple[Tensor, Tensor]:
        with amp():
            logits, length_logits = model(batch.src, batch.inputs)  # (B, T, V), (B, max_length)
        loss, nll = label_smoothed_nll(logits, batch.targets, label_smoothing, PAD)
        weight = cast("ConditionalMaskedLM", unwrapped(model)).length_loss_weight  # the task's model
        return loss + weight * length_nll(model, length_logits, batch.lengths), nll

    @torch.no_grad()
    def validate(
        self, model: nn.Module, data: MaskedPairs, device: torch.device, amp: Amp, n_decoded: int, split: str = "valid"
    ) -> dict[str, float]:
        model.eval()
        nll, n_tokens, right_lengths, n_sentences = 0.0, 0, 0, 0
        for batch in data.eval_batches(split):
            batch = batch.to(device)
            with amp():
                logits, length_logits = model(batch.src, batch.inputs)
            nll += label_smoothed_nll(logits, batch.targets, 0.0, PAD)[1].item()
            n_tokens += batch.n_targets
            right_lengths += int((length_logits.argmax(1) + 1 == batch.lengths).sum())
            n_sentences += len(batch.lengths)
        loss = nll / max(n_tokens, 1)
        result = {"valid_loss": loss, "valid_ppl": perplexity(loss), "length_accuracy": right_lengths / n_sentences}
        if n_decoded:
            triples = decode_split(model, data, split, n_decoded, MaskPredict(batch_size=128))
            result["exact_match"] = exact_match([h for _, _, h in triples], [r for _, r, _ in triples])
        return result

    def describe(self, data: MaskedPairs) -> str:
        return f"{super().describe(data)}; targets masked n ~ U{{1..N}} of N tokens"
