"""The input embeddings of the Transformer families: token vectors with their absolute positions."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.errors import DataError
from attnlab.nn.dropout import Dropout
from attnlab.nn.positional import PositionalEncoding


class Embeddings(nn.Module):
    """x = Dropout(Norm(E[w] * scale (+ or ||) PE(pos) [+ S[segment]])): the paper's scale is
    sqrt(D_tok) and Norm the identity; BERT's scale is 1 and Norm a LayerNorm. PE is the identity
    for relative schemes; the segment table (BERT's token types: sentence A or B) only where one is given."""

    def __init__(
        self,
        vocab_size: int,
        width: int,
        positional: PositionalEncoding,
        dropout: float,
        segments: nn.Embedding | None = None,
        scale: float | None = None,
        norm: nn.Module | None = None,
        tokens: nn.Embedding | None = None,
    ) -> None:
        super().__init__()
        # E: (vocab_size, width), N(0, 1) unless a table initialised otherwise is given (fairseq's fconv)
        self.tokens = tokens if tokens is not None else nn.Embedding(vocab_size, width)
        self.scale = math.sqrt(width) if scale is None else scale
        self.positional = positional
        self.segments = segments  # (n_segments, d_model), or None
        self.norm = norm if norm is not None else nn.Identity()
        self.dropout = Dropout(dropout)

    def positions(self, offset: int | Tensor, length: int, device: torch.device) -> Tensor:
        """(length,) positions offset, offset + 1, ...: where the next tokens sit in their sequence.
        Checked here, in Python, against what the positional scheme can encode (a learned table's
        max_len), so that the forward needs no host sync and compiles as one graph. A (1,) tensor
        ``offset`` is a static cache's count on the device: its capacity was checked instead."""
        if isinstance(offset, Tensor):
            return offset + torch.arange(length, device=device)
        self.check_positions(offset + length)
        return torch.arange(offset, offset + length, device=device)

    def check_positions(self, n: int) -> None:
        """Refuse positions 0 .. n - 1 if the positional scheme cannot encode them all."""
        limit = self.positional.max_positions
        if limit is not None and n > limit:
            raise DataError(f"position {n - 1} is beyond max_len ({limit}) of the learned positional table")

    def forward(self, ids: Tensor, positions: Tensor, segments: Tensor | None = None) -> Tensor:
        """(B, T) ids at (T,) positions, (B, T) segment ids or None -> (B, T, d_model)."""
        x = self.positional.embed(self.tokens(ids) * self.scale, positions)
        if self.segments is not None:
            x = x + self.segments(torch.zeros_like(ids) if segments is None else segments)
        return self.dropout(self.norm(x))
