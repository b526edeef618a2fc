"""The encoder-decoder (Vaswani et al. 2017): logits = Generator(Decoder(Embed(y), Encoder(Embed(x)))).

``Seq2Seq`` is what every encoder-decoder offers training and decoding (the recurrent one too),
``TransformerTargetSide`` the Transformer's target side, which any source side can feed (the
encoder over tokens here, the image captioner's patch encoder in nn/captioner.py). Padding is found
from ``pad_id``; ``decode`` accepts a :class:`DecoderCache` (incremental decoding).
"""

from __future__ import annotations

from typing import Callable, cast

import torch
from torch import Tensor, nn

from attnlab.nn.cache import DecoderCache
from attnlab.nn.embeddings import Embeddings
from attnlab.nn.layers import Encoder, EncoderLayer, Seq2SeqDecoder, Seq2SeqDecoderLayer
from attnlab.nn.stages import Carried, Stage, layer_ranges
from attnlab.nn.tensor_plan import TensorPlan, megatron


class Seq2Seq(nn.Module):
    """What every encoder-decoder offers training and decoding: ``encode`` the source once,
    ``decode`` target steps (all at once, or a few at a time with ``new_cache()``)."""

    # what each subclass defines: encode (B, S) ids -> memory and its validity; decode target ids, the memory, its
    # validity (and the subclass's own cache and options) -> logits
    encode: Callable[[Tensor], tuple[Tensor, Tensor]]
    decode: Callable[..., Tensor]

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

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_valid: Tensor,
        cache: DecoderCache | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """(B, T) target ids (the new steps only, with a cache) -> (B, T, V) logits, or with
        ``last_only`` (decoding) (B, 1, V): the vocabulary projection of the last position alone."""
        positions = self.tgt_embed.positions(cache.offset if cache is not None else 0, tgt_in.shape[1], tgt_in.device)
        y = self.decoder(self.tgt_embed(tgt_in, positions), tgt_in != self.pad_id, positions, memory, src_valid, cache)
        return self.generator(y[:, -1:] if last_only else y)

    def new_cache(self, capacity: int | None = None) -> DecoderCache:
        """A growable cache, or a static one of ``capacity`` target positions (within max_len)."""
        if capacity is not None:
            self.tgt_embed.check_positions(capacity)
        return self.decoder.new_cache(capacity)


class EncoderDecoder(TransformerTargetSide):
    """The paper's model. ``model(src_ids, tgt_in_ids)`` -> (B, T, V) logits."""

    def __init__(
        self,
        src_embed: Embeddings,
        tgt_embed: Embeddings,
        encoder: Encoder,
        decoder: Seq2SeqDecoder,
        generator: nn.Linear,
        pad_id: int,
    ) -> None:
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

    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of both stacks' layers (train.strategy tp, nn/tensor_plan.py)."""
        return megatron(self, "encoder", "decoder")

    def stages(self, n: int, head: str = "forward") -> list[Seq2SeqStage]:
        """The model cut into ``n`` pipeline stages of consecutive layers, the encoder's first
        (nn/stages.py)."""
        return [
            Seq2SeqStage(self, layers)
            for layers in layer_ranges(len(self.encoder.layers) + len(self.decoder.layers), n)
        ]


class Seq2SeqStage(Stage):
    """Layers ``layers`` of an EncoderDecoder, the encoder's counted first, then the decoder's (its
    own modules, shared). Into the first stage, (B, S) source and (B, T) target ids. While the
    stages run the encoder they carry the (B, S, d_model) source states, the (B, S) real source
    tokens and the target ids; the stage with the encoder's last layer turns the states into the
    memory and embeds the target. From there they carry the (B, T, d_model) target states, the
    (B, T) real target tokens, the memory, which every decoder layer reads (so its gradient from
    each stage flows back along the chain of stages to the encoder's), and the real source tokens.
    Out of the last, (B, T, V) logits."""

    def __init__(self, model: EncoderDecoder, layers: range) -> None:
        n_encoder = len(model.encoder.layers)
        super().__init__(layers, n_encoder + len(model.decoder.layers))
        encoding = range(layers.start, min(layers.stop, n_encoder))
        decoding = range(max(layers.start, n_encoder) - n_encoder, layers.stop - n_encoder)
        self.remembers = encoding.stop == n_encoder and len(encoding) > 0  # the encoder's last layer is here
        self.src_embed = model.src_embed if self.first else None
        self.encoder = (
            Encoder(
                # each stack's ModuleList holds the layers it was built from
                [cast(EncoderLayer, model.encoder.layers[i]) for i in encoding],
                model.encoder.norm if self.remembers else nn.Identity(),
            )
            if encoding
            else None
        )
        self.tgt_embed = model.tgt_embed if self.remembers else None
        self.decoder = (
            Seq2SeqDecoder(
                [cast(Seq2SeqDecoderLayer, model.decoder.layers[i]) for i in decoding],
                model.decoder.norm if self.last else nn.Identity(),
                model.decoder.causal,
            )
            if decoding
            else None
        )
        self.generator = model.generator if self.last else None
        self.pad_id = model.pad_id

    def enter(self, src: Tensor, tgt_in: Tensor) -> Carried:
        src_embed = cast(Embeddings, self.src_embed)  # set on the first stage, the only one that enters
        return src_embed(src, torch.arange(src.shape[1], device=src.device)), src != self.pad_id, tgt_in

    def through(self, *carried: Tensor) -> Carried:
        if self.encoder is not None:
            x, src_valid, tgt_in = carried  # (B, S, d_model), (B, S), (B, T)
            carried = (self.encoder(x, src_valid, torch.arange(x.shape[1], device=x.device)), src_valid, tgt_in)
        if self.remembers:
            memory, src_valid, tgt_in = carried
            tgt_embed = cast(Embeddings, self.tgt_embed)  # set where the stage remembers
            y = tgt_embed(tgt_in, torch.arange(tgt_in.shape[1], device=tgt_in.device))
            carried = (y, tgt_in != self.pad_id, memory, src_valid)
        if self.decoder is not None:
            y, tgt_valid, memory, src_valid = carried  # (B, T, d_model), (B, T), (B, S, d_model), (B, S)
            y = self.decoder(y, tgt_valid, torch.arange(y.shape[1], device=y.device), memory, src_valid)
            carried = (y, tgt_valid, memory, src_valid)
        return carried

    def leave(self, y: Tensor, tgt_valid: Tensor, memory: Tensor, src_valid: Tensor) -> Tensor:
        generator = cast(nn.Linear, self.generator)  # set on the last stage, the only one that leaves
        return generator(y)  # (B, T, d_model) -> (B, T, V)
