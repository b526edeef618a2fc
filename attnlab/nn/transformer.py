"""The Transformer family: embeddings, encoder and decoder stacks, and the three models.

EncoderDecoder  seq2seq (Vaswani et al. 2017):  logits = Generator(Decoder(Embed(y), Encoder(Embed(x))))
DecoderLM       GPT-style language model:        logits = Generator(Decoder(Embed(x)))  (causal, no cross-attention),
                optionally with multi-token heads: logits_j = Generator(Head_j(Decoder(Embed(x)))), token t + 1 + j
EncoderOnly     BERT-style:                      masked-LM logits, or class logits from a pooled vector

Models take token ids and find padding from ``pad_id``. Decoders accept a :class:`DecoderCache`;
with one, pass only the new target steps and get their logits (incremental decoding).
``new_cache(capacity)`` makes a :class:`StaticDecoderCache` of that many positions instead, for
steps of fixed shapes (CUDA graphs).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.errors import DataError
from attnlab.nn.cache import DecoderCache, StaticDecoderCache
from attnlab.nn.dropout import Dropout
from attnlab.nn.layers import DecoderLayer, EncoderLayer
from attnlab.nn.masks import AttentionMask
from attnlab.nn.positional import PositionalEncoding


class LayerStack(nn.Module):
    """Layers applied in order, optionally with activation checkpointing in training (keep only
    each layer's input and recompute its inside during the backward pass)."""

    def __init__(self, layers: list[nn.Module], norm: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.checkpoint_activations = False

    def run_layer(self, layer: nn.Module, *args) -> Tensor:
        if self.checkpoint_activations and self.training:
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)


class Embeddings(nn.Module):
    """x = Dropout(Norm(E[w] * scale (+ or ||) PE(pos) [+ S[segment]])): the paper's scale is
    sqrt(D_tok) and Norm the identity; BERT's scale is 1 and Norm a LayerNorm. PE is the identity
    for relative schemes; the segment table (BERT's token types: sentence A or B) only where one is given."""

    def __init__(self, vocab_size: int, width: int, positional: PositionalEncoding, dropout: float,
                 segments: nn.Embedding | None = None, scale: float | None = None,
                 norm: nn.Module | None = None) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, width)
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


class Encoder(LayerStack):
    """A stack of EncoderLayers; ``norm`` is a final LayerNorm for pre-norm stacks, else identity."""

    def __init__(self, layers: list[EncoderLayer], norm: nn.Module) -> None:
        super().__init__(layers, norm)

    def forward(self, x: Tensor, valid: Tensor, positions: Tensor, allowed: Tensor | None = None) -> Tensor:
        """x: (B, S, d_model); valid: (B, S) True for real tokens; positions: (S,); allowed: a
        boolean mask broadcastable to (B, H, S, S) of who may attend to whom besides padding (a
        graph's neighbourhoods), or None -> (B, S, d_model)."""
        mask = AttentionMask(key_valid=valid, explicit=allowed)
        for layer in self.layers:
            x = self.run_layer(layer, x, mask, (positions, positions))
        return self.norm(x)


class Decoder(LayerStack):
    """A stack of DecoderLayers under a causal mask, with or without cross-attention; with
    ``causal=False`` every target position sees every other (a conditional masked language
    model's decoder, nn/cmlm.py), padding still masked."""

    def __init__(self, layers: list[DecoderLayer], norm: nn.Module, causal: bool = True) -> None:
        super().__init__(layers, norm)
        self.causal = causal

    def forward(self, y: Tensor, valid: Tensor, positions: Tensor, memory: Tensor | None = None,
                memory_valid: Tensor | None = None, cache: DecoderCache | None = None) -> Tensor:
        """y: (B, T, d_model) at (T,) positions; valid: (B, T); memory: (B, S, d_model) with
        memory_valid (B, S). With a cache, y holds only the steps after the cached ones, and the
        source mask of the first step is kept with the cached source keys (and reordered with them)."""
        if cache is not None:
            valid = cache.extend(valid)  # (B, Tk): cached steps and these (a static cache: all its capacity)
            if memory is not None:
                memory_valid = cache.source_valid(memory_valid)
        k_positions = torch.arange(valid.shape[1], device=y.device)
        self_mask = AttentionMask(key_valid=self.keys_to_mask(valid), causal=self.causal)  # over (B, Tk) cached and new steps
        memory_mask = AttentionMask(key_valid=memory_valid) if memory is not None else None
        memory_positions = torch.arange(memory.shape[1], device=y.device) if memory is not None else None
        for i, layer in enumerate(self.layers):
            y = self.run_layer(layer, y, self_mask, (positions, k_positions), memory, memory_mask,
                               cache.self_attn[i] if cache is not None else None,
                               cache.cross_attn[i] if cache is not None else None, memory_positions)
        return self.norm(y)

    def keys_to_mask(self, valid: Tensor) -> Tensor | None:
        """(B, Tk) real keys -> the padding the self-attention must mask. A causal decoder masks
        none: padding only ever follows a row's real tokens (right padding; rows that leave a decode
        are fed padding), so causality already hides every padding key from every real query. Only
        the padding positions' own outputs change, and nothing reads them (the losses skip PAD
        targets). The fused kernels then get ``is_causal`` and no mask tensor. A non-causal decoder
        (nn/cmlm.py) masks ``valid``."""
        return None if self.causal else valid

    def new_cache(self, capacity: int | None = None) -> DecoderCache:
        """A growable cache, or with ``capacity`` a static one of that many positions."""
        if capacity is None:
            return DecoderCache(len(self.layers))
        return StaticDecoderCache(len(self.layers), capacity, next(self.parameters()).device)


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
    decoder: Decoder
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

    def __init__(self, src_embed: Embeddings, tgt_embed: Embeddings, encoder: Encoder, decoder: Decoder,
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


class MultiTokenHead(nn.Module):
    """An extra output head of multi-token prediction (Gloeckle et al. 2024): the trunk's state at
    position t through a pre-norm residual feed-forward block, h + FFN(LayerNorm(h)), which the
    shared output projection reads as token t + 1 + j. (Gloeckle et al. give each head a whole
    Transformer layer; a feed-forward block, Medusa's head (Cai et al. 2024), keeps no cache of its
    own, so a draft from the heads costs no extra pass when decoding.)"""

    def __init__(self, ffn: nn.Module, residual: nn.Module) -> None:
        super().__init__()
        self.ffn, self.residual = ffn, residual

    def forward(self, h: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        return self.residual(h, self.ffn)


class DecoderLM(nn.Module):
    """A causal language model. ``model(ids)`` -> (B, T, V) logits of each next token; with
    ``heads`` (multi-token prediction), ``model(ids, ahead=True)`` -> (B, T, 1 + k, V): the next
    token's logits, then head j's for token t + 1 + j. ``head_weights``: each head's weight in the
    training loss (1 for the next token)."""

    def __init__(self, embed: Embeddings, decoder: Decoder, generator: nn.Linear, pad_id: int,
                 heads: list[MultiTokenHead] | None = None, head_weight: float = 1.0) -> None:
        super().__init__()
        self.embed, self.decoder, self.generator = embed, decoder, generator
        self.heads = nn.ModuleList(heads or [])
        self.head_weights = (1.0,) + (head_weight,) * len(self.heads)
        self.pad_id = pad_id

    def forward(self, ids: Tensor, cache: DecoderCache | None = None, last_only: bool = False,
                ahead: bool = False) -> Tensor:
        """(B, T) ids (the new steps only, with a cache) -> (B, T, V) logits (``last_only``: (B, 1, V);
        ``ahead``: (B, T or 1, 1 + k, V), every head's)."""
        y = self.states(ids, cache)
        y = y[:, -1:] if last_only else y
        return self.ahead(y) if ahead else self.generator(y)

    def states(self, ids: Tensor, cache: DecoderCache | None = None) -> Tensor:
        """(B, T) ids -> (B, T, d_model): the decoder's output, which every head reads."""
        positions = self.embed.positions(cache.offset if cache is not None else 0, ids.shape[1], ids.device)
        return self.decoder(self.embed(ids, positions), ids != self.pad_id, positions, cache=cache)

    def ahead(self, y: Tensor) -> Tensor:
        """(B, T, d_model) states -> (B, T, 1 + k, V): the next token's logits, then each head's."""
        return torch.stack([self.generator(h) for h in (y, *(head(y) for head in self.heads))], dim=2)

    def new_cache(self, capacity: int | None = None) -> DecoderCache:
        """A growable cache, or a static one of ``capacity`` positions (within max_len)."""
        if capacity is not None:
            self.embed.check_positions(capacity)
        return self.decoder.new_cache(capacity)


class VocabularyProjection(nn.Linear):
    """The pre-softmax map d_model -> V (no bias), whose weight may have rows past V: a vocabulary
    padded to a multiple of 64 gives the matrix products aligned shapes on a GPU. The padded
    columns of the product are cut off here, so no softmax, loss or search ever sees them, and
    they get no gradient. ``never`` lists token ids that are never an output: their logits are
    -inf (the control tokens a pretrained model's vocabulary did not have, so that its distribution
    over its own tokens is unchanged)."""

    def __init__(self, d_model: int, rows: int, vocab_size: int, never: tuple[int, ...] = ()) -> None:
        super().__init__(d_model, rows, bias=False)
        self.vocab_size = vocab_size
        excluded = torch.zeros(vocab_size, dtype=torch.bool)
        excluded[list(never)] = True
        self.register_buffer("excluded", excluded if never else None, persistent=False)  # (V,)

    def forward(self, h: Tensor) -> Tensor:
        """(..., d_model) -> (..., V) logits."""
        logits = super().forward(h)[..., :self.vocab_size]  # (..., rows) -> (..., V)
        return logits if self.excluded is None else logits.masked_fill(self.excluded, -torch.inf)


class MaskedLMHead(nn.Module):
    """BERT's prediction head: logits = W_out LayerNorm(act(W h + b)) + b_out, W_out tied to the
    embeddings, b_out one bias per word."""

    def __init__(self, d_model: int, activation: nn.Module, eps: float, projection: VocabularyProjection) -> None:
        super().__init__()
        self.transform = nn.Linear(d_model, d_model)
        self.activation = activation
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.projection = projection
        self.bias = nn.Parameter(torch.zeros(projection.vocab_size))

    def forward(self, h: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, V)."""
        return self.projection(self.norm(self.activation(self.transform(h)))) + self.bias


class FirstTokenPooling(nn.Module):
    """BERT's summary of a sequence: the vector at the first position (the [CLS] token)."""

    def forward(self, h: Tensor, valid: Tensor) -> Tensor:
        """(B, T, d_model), (B, T) -> (B, d_model)."""
        return h[:, 0]


class MeanPooling(nn.Module):
    """The mean of the vectors at real (non-padding) positions (Sentence-BERT's summary)."""

    def forward(self, h: Tensor, valid: Tensor) -> Tensor:
        """(B, T, d_model), (B, T) -> (B, d_model)."""
        weights = valid.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        return (h * weights).sum(1) / weights.sum(1).clamp(min=1.0)


class ClassificationHead(nn.Module):
    """BERT's pooler and classifier: logits = W_c Dropout(tanh(W_p pool(h) + b_p)) + b_c."""

    def __init__(self, d_model: int, n_classes: int, dropout: float, pooling: nn.Module) -> None:
        super().__init__()
        self.pooling = pooling
        self.pool = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)
        self.out = nn.Linear(d_model, n_classes)

    def forward(self, h: Tensor, valid: Tensor) -> Tensor:
        """(B, T, d_model), (B, T) True at real tokens -> (B, n_classes)."""
        return self.out(self.dropout(torch.tanh(self.pool(self.pooling(h, valid)))))


class EncoderOnly(nn.Module):
    """BERT-style encoder. ``model(ids)`` -> (B, T, V) masked-LM logits; ``model.classify(ids)`` ->
    (B, n_classes) from the pooled sequence (first-token pooling wants a CLS token there). With
    segment embeddings, ``segments`` (B, T) says which sentence of a pair each token is in."""

    def __init__(self, embed: Embeddings, encoder: Encoder, mlm_head: MaskedLMHead,
                 classifier: ClassificationHead, pad_id: int) -> None:
        super().__init__()
        self.embed, self.encoder = embed, encoder
        self.mlm_head, self.classifier = mlm_head, classifier
        self.pad_id = pad_id

    def encode(self, ids: Tensor, segments: Tensor | None = None) -> Tensor:
        """(B, T) ids -> (B, T, d_model) contextual vectors."""
        positions = self.embed.positions(0, ids.shape[1], ids.device)
        return self.encoder(self.embed(ids, positions, segments), ids != self.pad_id, positions)

    def forward(self, ids: Tensor, segments: Tensor | None = None) -> Tensor:
        return self.mlm_head(self.encode(ids, segments))

    def classify(self, ids: Tensor, segments: Tensor | None = None) -> Tensor:
        return self.classifier(self.encode(ids, segments), ids != self.pad_id)
