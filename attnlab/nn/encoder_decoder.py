"""The encoder-decoder (Vaswani et al. 2017): logits = Generator(Decoder(Embed(y), Encoder(Embed(x)))).

``Seq2Seq`` is what every encoder-decoder offers training and decoding (the recurrent one too),
``TransformerTargetSide`` the Transformer's target side, which any source side can feed (the
encoder over tokens here, the image captioner's patch encoder in nn/captioner.py). Padding is found
from ``pad_id``; ``decode`` accepts a :class:`DecoderCache` (incremental decoding).
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.nn.cache import DecoderCache
from attnlab.nn.embeddings import Embeddings
from attnlab.nn.stacks import Encoder, Seq2SeqDecoder


class Seq2Seq(nn.Module):
    """What every encoder-decoder offers training and decoding: ``encode`` the source once,
    ``decode`` target steps (all at once, or a few at a time with ``new_cache()``)."""

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """(B, S) source ids, (B, T) decoder input ids (BOS y_1 ... y_{T-1}) -> (B, T, V) logits."""
        memory, src_valid = self.encode(src)
        return self.decode(tgt_in, memory, src_valid)


class TransformerTargetSide(Seq2Seq):
    """The Transformer's target side, which any source side can feed: ``tgt_embed``, ``decoder``
    (cross-attending to the memory that ``encode`` gives), ``generator`` and ``pad_id``; a
    subclass sets them and defines ``encode``."""

    tgt_embed: Embeddings
    decoder: Seq2SeqDecoder
    generator: nn.Module
    pad_id: int

    def decode(self, tgt_in: Tensor, memory: Tensor, src_valid: Tensor, cache: DecoderCache | None = None,
               last_only: bool = False) -> Tensor:
        """(B, T) target ids (the new steps only, with a cache) -> (B, T, V) logits, or with
        ``last_only`` (decoding) (B, 1, V): the vocabulary projection of the last position alone."""
        positions = self.tgt_embed.positions(cache.offset if cache is not None else 0, tgt_in.shape[1], tgt_in.device)
        y = self.decoder(self.tgt_embed(tgt_in, positions), tgt_in != self.pad_id, positions,
                         memory, src_valid, cache)
        return self.generator(y[:, -1:] if last_only else y)

    def new_cache(self, capacity: int | None = None) -> DecoderCache:
        """A growable cache, or a static one of ``capacity`` target positions (within max_len)."""
        if capacity is not None:
            self.tgt_embed.check_positions(capacity)
        return self.decoder.new_cache(capacity)


class EncoderDecoder(TransformerTargetSide):
    """The paper's model. ``model(src_ids, tgt_in_ids)`` -> (B, T, V) logits."""

    def __init__(self, src_embed: Embeddings, tgt_embed: Embeddings, encoder: Encoder, decoder: Seq2SeqDecoder,
                 generator: nn.Linear, pad_id: int) -> None:
        super().__init__()
        self.src_embed, self.tgt_embed = src_embed, tgt_embed
        self.encoder, self.decoder = encoder, decoder
        self.generator = generator
        self.pad_id = pad_id

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S) ids -> memory (B, S, d_model) and its validity (B, S)."""
        valid = src != self.pad_id
        positions = self.src_embed.positions(0, src.shape[1], src.device)
        return self.encoder(self.src_embed(src, positions), valid, positions), valid
