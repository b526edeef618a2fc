"""Mask-Predict (Ghazvininejad et al. 2019): parallel decoding of a conditional masked language
model (nn/cmlm.py) in a constant number of passes.

For each source, the L most likely lengths are candidates (the length beam). For a candidate of
N tokens:

    t = 0:         every position masked; predict all of them: y_i = argmax p_i, keep p_i(y_i)
    t = 1 .. T-1:  re-mask the n = floor(N (T - t) / T) tokens of lowest probability; predict those
                   again, given the others; update their tokens and probabilities only

and the output is the candidate of highest mean log-probability (1/N) sum_i log p_i(y_i). Each
prediction is the argmax over the vocabulary less <pad>, <bos>, <eos> and <mask> (the targets
hold none of them); p_i(y_i) is the model's probability of it over the whole vocabulary. All the
sentences of a batch and their candidates are decoded together, each candidate padded to the
longest; padding is masked in the decoder, so a candidate's tokens do not depend on the others.
Ties between equal probabilities re-mask the earlier position first.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from attnlab.data.tokenizers import BOS, EOS, MASK, PAD

NEVER_OUTPUT = (PAD, BOS, EOS, MASK)
MAX_ITERATIONS = 1000  # beyond this a request is a mistake (every N <= T is fully re-predicted long before)


class MaskPredictModel(Protocol):
    """What mask-predict asks of a model (nn/cmlm.py's ConditionalMaskedLM, or anything with these)."""

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]: ...

    def decode(self, tgt: Tensor, memory: Tensor, src_valid: Tensor) -> Tensor: ...

    def length_predictor(self, memory: Tensor, src_valid: Tensor) -> Tensor: ...


def masks_at(lengths: Tensor, t: int, iterations: int) -> Tensor:
    """n = floor(N (T - t) / T): how many of each (B,) length's tokens iteration t (re-)masks."""
    return lengths * (iterations - t) // iterations


def least_probable(logp: Tensor, real: Tensor, n: Tensor) -> Tensor:
    """(B, T) log-probabilities, (B, T) True at real positions, (B,) counts -> (B, T) True at the
    n[b] real positions of lowest log-probability in each row (the earlier one first among equals)."""
    order = logp.masked_fill(~real, float("inf")).argsort(dim=1, stable=True)  # (B, T), lowest first
    rank = order.argsort(dim=1)  # (B, T): each position's place in that order
    return rank < n[:, None]


def predict(
    model: MaskPredictModel, tokens: Tensor, logp: Tensor, masked: Tensor, memory: Tensor, src_valid: Tensor
) -> tuple[Tensor, Tensor]:
    """One parallel pass: (B, T) tokens, their log-probabilities, and which are masked (their
    tokens are <mask>) -> tokens and log-probabilities with the masked positions predicted anew."""
    log_probs = model.decode(tokens, memory, src_valid).float().log_softmax(-1)  # (B, T, V)
    allowed = log_probs.index_fill(-1, torch.tensor(NEVER_OUTPUT, device=tokens.device), float("-inf"))
    best_logp, best = allowed.max(-1)  # (B, T) each
    return torch.where(masked, best, tokens), torch.where(masked, best_logp, logp)


@torch.no_grad()
def mask_predict(
    model: MaskPredictModel, src: Tensor, iterations: int = 10, length_beam: int = 5
) -> list[tuple[list[int], float]]:
    """(B, S) source ids (+ EOS, PAD-padded) -> for each source, the chosen target ids and their
    mean log-probability. ``model`` offers ``encode``, ``decode`` (non-causal) and a ``length_predictor``;
    ``iterations`` T and ``length_beam`` L as decode/spec.py's :class:`~attnlab.decode.spec.MaskPredict` checks them."""
    memory, src_valid = model.encode(src)  # (B, S, d_model), (B, S)
    length_logits = model.length_predictor(memory, src_valid)  # (B, max_length)
    beam = min(length_beam, length_logits.shape[1])
    lengths = (length_logits.topk(beam, dim=1).indices + 1).reshape(-1)  # (B L,): sentence b's candidates together
    memory, src_valid = memory.repeat_interleave(beam, 0), src_valid.repeat_interleave(beam, 0)  # (B L, S, ...)
    real = torch.arange(int(lengths.max()), device=src.device)[None, :] < lengths[:, None]  # (B L, T)
    tokens = torch.full(real.shape, MASK, device=src.device).masked_fill(~real, PAD)  # (B L, T)
    logp = torch.zeros(real.shape, device=src.device)
    tokens, logp = predict(model, tokens, logp, real, memory, src_valid)  # t = 0: every position masked
    for t in range(1, iterations):
        masked = least_probable(logp, real, masks_at(lengths, t, iterations))
        tokens, logp = predict(model, tokens.masked_fill(masked, MASK), logp, masked, memory, src_valid)
    mean_logp = (logp * real).sum(1) / lengths  # (B L,)
    best = mean_logp.view(-1, beam).argmax(1) + torch.arange(src.shape[0], device=src.device) * beam  # (B,) rows
    return [(tokens[row, : int(lengths[row])].tolist(), float(mean_logp[row])) for row in best.tolist()]
