"""Search over the models' incremental interface: encode once, then one step at a time with a cache."""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.data.tokenizers import BOS, EOS, PAD
from attnlab.nn.transformer import EncoderDecoder


@torch.no_grad()
def greedy_decode(model: EncoderDecoder, src: Tensor, max_len: int | None = None) -> list[list[int]]:
    """The argmax token at every step, until EOS or ``max_len`` (default: source length + 50, the
    paper's rule, within the positions the model can encode). src: (B, S) padded ids -> B lists of
    ids without BOS and EOS."""
    memory, src_valid = model.encode(src)
    B = src.shape[0]
    max_len = int(src_valid.sum(1).max()) + 50 if max_len is None else max_len
    limit = model.tgt_embed.positional.max_positions
    max_len = max_len if limit is None else min(max_len, limit)
    cache = model.new_cache()
    step_input = torch.full((B, 1), BOS, dtype=torch.long, device=src.device)
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)
    steps = []
    for _ in range(max_len):
        next_token = model.decode(step_input, memory, src_valid, cache)[:, -1].argmax(-1)  # (B,)
        next_token = next_token.masked_fill(finished, PAD)  # finished rows only pad, and are masked
        steps.append(next_token)
        finished |= next_token == EOS
        if finished.all():
            break
        step_input = next_token[:, None]
    out = torch.stack(steps, dim=1).tolist()  # (B, t)
    return [row[: row.index(EOS)] if EOS in row else [t for t in row if t != PAD] for row in out]
