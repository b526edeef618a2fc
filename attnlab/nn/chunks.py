"""Encoding a long input in overlapping chunks (lecture 003: "[0-999], [950-1949]").

The input is cut into windows of ``size`` tokens, each starting ``size - overlap`` after the last
(the last window ends at the input's end); each window is encoded on its own, its positions
numbered from 0, so no token attends beyond its window. Every position then takes its vector from
the window where it has the most context on its poorer side, min(tokens before it, tokens after
it) within the window: the "max context" rule of BERT's sliding windows over long documents. A
chunk as long as the input is the whole-input encoding itself.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, cast

import torch
from torch import Tensor, nn

from attnlab.nn.interfaces import Seq2SeqModel


@dataclass(frozen=True)
class Chunking:
    """Windows of ``size`` tokens overlapping by ``overlap``."""

    size: int
    overlap: int = 0

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.overlap < self.size:
            raise ValueError(
                f"chunks need size >= 1 and 0 <= overlap < size (got size {self.size}, overlap {self.overlap})"
            )

    def windows(self, length: int) -> list[tuple[int, int]]:
        """[start, end) of each window over ``length`` tokens."""
        if length <= self.size:
            return [(0, length)]
        starts = list(range(0, length - self.size, self.size - self.overlap)) + [length - self.size]
        return [(a, a + self.size) for a in dict.fromkeys(starts)]

    def owners(self, length: int) -> Tensor:
        """(length,) the index of the window each position takes its vector from (max context)."""
        windows = self.windows(length)
        pos = torch.arange(length)
        context = torch.stack(
            [torch.where((pos >= a) & (pos < b), torch.minimum(pos - a, b - 1 - pos), -1) for a, b in windows]
        )  # (W, length)
        return context.argmax(0)  # the first window on ties


def chunked_states(encode: Callable[[slice], Tensor], length: int, chunking: Chunking) -> Tensor:
    """(B, length, d) vectors of an input encoded window by window: ``encode(window)`` is given the
    slice of positions of one window and returns its (B, w, d) vectors."""
    windows = chunking.windows(length)
    states = [encode(slice(a, b)) for a, b in windows]
    owners = chunking.owners(length)
    out = states[0].new_empty(states[0].shape[0], length, states[0].shape[2])
    for i, ((a, b), h) in enumerate(zip(windows, states)):
        mine = (owners[a:b] == i).nonzero().squeeze(1)  # (m,) offsets in the window
        out[:, a + mine] = h[:, mine]
    return out


@contextlib.contextmanager
def chunked_encoding(model: nn.Module, chunking: Chunking) -> Iterator[nn.Module]:
    """Within the block, ``model.encode`` reads its input in chunks: an encoder-decoder's source
    (the decoder attends over the assembled memory) or an encoder-only model's text (its heads
    read the assembled vectors)."""
    whole = cast(Callable[..., Any], model.encode)  # the model's own encode (nn.Module types attributes as tensors)
    encode: Callable[..., tuple[Tensor, Tensor] | Tensor]
    if isinstance(model, Seq2SeqModel):  # encode(src) -> (memory, valid)

        def encode(src: Tensor) -> tuple[Tensor, Tensor]:
            memory = chunked_states(lambda window: whole(src[:, window])[0], src.shape[1], chunking)
            return memory, src != cast(int, model.pad_id)  # a seq2seq model's padding id
    else:  # encode(ids, segments) -> vectors

        def encode(ids: Tensor, segments: Tensor | None = None) -> Tensor:
            return chunked_states(
                lambda window: whole(ids[:, window], None if segments is None else segments[:, window]),
                ids.shape[1],
                chunking,
            )

    setattr(model, "encode", encode)  # what `model.encode = encode` does, where nn.Module types its attributes
    try:
        yield model
    finally:
        del model.encode  # the class's own again
