"""Teacher-forced likelihood: the model's logits for every target position given the true prefix,
the training loss from them, and the NLL per target token and perplexity over a set of batches
(validation, `attnlab score`)."""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch
from torch import nn

from attnlab.data.batching import Batch
from attnlab.data.tokenizers import PAD
from attnlab.eval.metrics import perplexity
from attnlab.models.family import unwrapped
from attnlab.nn.losses import label_smoothed_nll

Amp = Callable[[], ContextManager[object]]  # the context a forward runs in: torch.autocast's, or none


def logits_of(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Teacher-forced logits (B, T, V) of an EncoderDecoder (with src) or a DecoderLM (without)."""
    logits: torch.Tensor = model(batch.src, batch.tgt_in) if batch.src is not None else model(batch.tgt_in)
    return logits


def teacher_forced_loss(
    model: nn.Module, batch: Batch, label_smoothing: float = 0.0, amp: Amp = contextlib.nullcontext
) -> tuple[torch.Tensor, torch.Tensor]:
    """(label-smoothed loss, NLL), each summed over the target tokens; the forward under ``amp``,
    the loss in float32."""
    with amp():
        logits = logits_of(model, batch)
    return label_smoothed_nll(logits, batch.tgt_out, label_smoothing, PAD)


def multi_token_loss(
    model: nn.Module, batch: Batch, label_smoothing: float = 0.0, amp: Amp = contextlib.nullcontext
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-token prediction's loss (Gloeckle et al. 2024) for a DecoderLM: the next-token loss plus,
    for each extra head j, its weight times its loss on token t + 1 + j (summed over the target
    tokens, as :func:`teacher_forced_loss`, which it is for a model without extra heads, a plug-in
    family's included). The NLL is the next-token head's alone: what validation and perplexity
    measure."""
    weights = getattr(unwrapped(model), "head_weights", (1.0,))  # (1 + k,)
    if len(weights) == 1:
        return teacher_forced_loss(model, batch, label_smoothing, amp)
    with amp():
        logits = model(batch.tgt_in, ahead=True)  # (B, T, 1 + k, V)
    loss, nll = label_smoothed_nll(logits[:, :, 0], batch.tgt_out, label_smoothing, PAD)
    for j in range(1, min(len(weights), batch.tgt_out.shape[1])):  # a window of T tokens has T - j targets for head j
        head_loss, _ = label_smoothed_nll(logits[:, :-j, j], batch.tgt_out[:, j:], label_smoothing, PAD)
        loss = loss + weights[j] * head_loss
    return loss, nll


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: list[Batch], device: torch.device | str | None = None, amp: Amp = contextlib.nullcontext
) -> dict[str, float]:
    """Teacher-forced NLL per target token and its perplexity (no label smoothing), on ``device``
    (default: the model's)."""
    device = device or next(model.parameters()).device
    model.eval()
    nll_sum, n_tokens = 0.0, 0
    for batch in batches:
        batch = batch.to(device)
        nll_sum += teacher_forced_loss(model, batch, 0.0, amp)[1].item()
        n_tokens += batch.n_targets
    loss = nll_sum / max(n_tokens, 1)
    return {"loss": loss, "ppl": perplexity(loss), "tokens": n_tokens}
