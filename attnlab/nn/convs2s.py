"""The convolutional sequence-to-sequence model (Gehring et al. 2017, ConvS2S; fairseq's ``fconv``).

Both sides are stacks of gated convolutions with residual connections; the decoder's convolutions
see only the past, and every decoder layer attends to the encoder on its own:

    encoder layer:  h' = (GLU(Conv(h)) + h) * sqrt(1/2)        (B, S, C), "same" padding
    decoder layer:  g = GLU(CausalConv(h))                      (B, T, C)
                    d = (W_d g + e_tgt) * sqrt(1/2)              query, in embedding space
                    a = softmax(d z^T)                           over the source, z the encoder outputs
                    c = a (z + e_src) * sqrt(1/2) * sqrt(|x|)    values: outputs plus source embeddings
                    h' = ((W_c c + g) * sqrt(1/2) + h) * sqrt(1/2)

(|x| the number of real source tokens). Linear maps and convolutions are weight-normalised and
initialised so that the variance of the activations is kept (the paper's section 3.5); the
encoder's output gradient is scaled by 1 / (2 x decoder layers), since every decoder layer's
attention reads it. The decoder's convolutions cache their last k - 1 inputs, so decoding feeds
one token a step (:class:`ConvCache`).
"""

from __future__ import annotations

import math
from typing import Callable, Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from attnlab.nn.dropout import Dropout
from attnlab.nn.embeddings import Embeddings
from attnlab.nn.encoder_decoder import Seq2Seq
from attnlab.nn.positional import LearnedPositional

HALF = math.sqrt(0.5)


def normed_linear(d_in: int, d_out: int, dropout: float = 0.0) -> nn.Module:
    """A weight-normalised Linear, weights N(0, (1 - p) / d_in): the variance its input keeps
    after dropout p."""
    linear = nn.Linear(d_in, d_out)
    nn.init.normal_(linear.weight, std=math.sqrt((1 - dropout) / d_in))
    nn.init.zeros_(linear.bias)
    return weight_norm(linear)


def normed_conv(channels: int, kernel_width: int, dropout: float) -> nn.Module:
    """A weight-normalised convolution from C to 2C channels (a GLU halves them), weights
    N(0, 4 (1 - p) / (k C)): the GLU's gate keeps a quarter of the variance."""
    conv = nn.Conv1d(channels, 2 * channels, kernel_width)
    nn.init.normal_(conv.weight, std=math.sqrt(4 * (1 - dropout) / (kernel_width * channels)))
    assert conv.bias is not None  # a Conv1d has a bias unless told otherwise
    nn.init.zeros_(conv.bias)
    return weight_norm(conv)


def token_embedding(n: int, d: int, pad_id: int | None) -> nn.Embedding:
    embed = nn.Embedding(n, d, padding_idx=pad_id)
    nn.init.normal_(embed.weight, std=0.1)
    if pad_id is not None:
        nn.init.zeros_(embed.weight[pad_id])
    return embed


class _ScaleContext(Protocol):
    """What :class:`GradMultiply`'s ``ctx`` carries from its forward to its backward."""

    scale: float


class GradMultiply(torch.autograd.Function):
    """The identity forward; the gradient multiplied by ``scale`` backward."""

    @staticmethod
    def forward(ctx: _ScaleContext, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x.clone()

    @staticmethod
    def backward(ctx: _ScaleContext, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.scale, None


def conv_embedding(vocab_size: int, d: int, max_len: int, pad_id: int, dropout: float) -> Embeddings:
    """fconv's embedding: token plus learned position vectors (positions from 0), unscaled, then
    dropout; both tables N(0, 0.1), the padding row zero. (B, T) ids -> (B, T, D)."""
    tokens = token_embedding(vocab_size, d, pad_id)
    positional = LearnedPositional(d, max_len)
    nn.init.normal_(positional.table.weight, std=0.1)
    return Embeddings(vocab_size, d, positional, dropout, scale=1.0, tokens=tokens)


class ConvSide(nn.Module):
    """What the encoder and the decoder share: the embedding, the projection of its D features to the
    C channels of the k-wide convolutions, those, and a projection back to D."""

    def __init__(self, embed: Embeddings, d_model: int, n_layers: int, kernel_width: int, dropout: float) -> None:
        super().__init__()
        self.embed, self.dropout, self.kernel_width = embed, Dropout(dropout), kernel_width
        d = embed.tokens.embedding_dim
        self.fc_in = normed_linear(d, d_model, dropout)
        self.convs = nn.ModuleList(normed_conv(d_model, kernel_width, dropout) for _ in range(n_layers))
        self.fc_out = normed_linear(d_model, d)


class ConvEncoder(ConvSide):
    """(B, S) ids -> keys z (B, S, D) and values (z + e) sqrt(1/2) (B, S, D), zero at padding."""

    def __init__(
        self, embed: Embeddings, d_model: int, n_layers: int, kernel_width: int, dropout: float, grad_scale: float
    ) -> None:
        super().__init__(embed, d_model, n_layers, kernel_width, dropout)
        self.grad_scale = grad_scale
        self.padding = ((kernel_width - 1) // 2, kernel_width // 2)  # the output at i is centred on i

    def forward(self, src: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        e = self.embed(src, self.embed.positions(0, src.shape[1], src.device))  # (B, S, D)
        pad = ~valid[..., None]  # (B, S, 1)
        h = self.fc_in(e).transpose(1, 2)  # (B, C, S)
        for conv in self.convs:
            x = self.dropout(h.masked_fill(pad.transpose(1, 2), 0.0))
            h = (F.glu(conv(F.pad(x, self.padding)), dim=1) + h) * HALF
        z = self.fc_out(h.transpose(1, 2)).masked_fill(pad, 0.0)  # (B, S, D)
        # Function.apply is untyped in PyTorch: it returns what forward returns
        z = cast(Callable[[Tensor, float], Tensor], GradMultiply.apply)(z, self.grad_scale)
        return z, (z + e) * HALF


class ConvCache:
    """The decoder's state between steps: each layer's inputs so far (B, k - 1 + t, C), k - 1 zeros
    first, and the number of steps t taken."""

    def __init__(self) -> None:
        self.inputs: list[Tensor] = []
        self.length = 0

    def reorder(self, index: Tensor, targets_only: bool = False) -> None:
        """Keep row ``index[i]`` as row i (beam search); the cache holds nothing of the source."""
        self.inputs = [x.index_select(0, index) for x in self.inputs]

    def truncate(self, length: int) -> None:
        """Forget the steps from ``length`` on."""
        drop = self.length - length
        if drop > 0:
            self.inputs = [x[:, : x.shape[1] - drop] for x in self.inputs]
            self.length = length


class DecoderAttention(nn.Module):
    """One decoder layer's attention over the encoder (the module docstring's d, a, c)."""

    def __init__(self, d_model: int, d_embed: int) -> None:
        super().__init__()
        self.query, self.out = normed_linear(d_model, d_embed), normed_linear(d_embed, d_model)

    def forward(self, g: Tensor, e_tgt: Tensor, keys: Tensor, values: Tensor, valid: Tensor) -> Tensor:
        """(B, T, C) conv outputs, (B, T, D) target embeddings, (B, S, D) keys and values, (B, S) validity."""
        d = (self.query(g) + e_tgt) * HALF  # (B, T, D)
        a = (d @ keys.transpose(1, 2)).masked_fill(~valid[:, None], -torch.inf).softmax(-1)  # (B, T, S)
        real = valid.sum(1).to(g.dtype)[:, None, None]  # (B, 1, 1): |x|
        c = (a @ values) * real.sqrt()  # (B, T, D)
        return (self.out(c) + g) * HALF


class ConvDecoder(ConvSide):
    """(B, T) target ids y_{<t} (the new ones only, with a cache) -> (B, T, V) logits."""

    def __init__(
        self, embed: Embeddings, d_model: int, n_layers: int, kernel_width: int, dropout: float, vocab_size: int
    ) -> None:
        super().__init__(embed, d_model, n_layers, kernel_width, dropout)
        d = embed.tokens.embedding_dim
        self.attention = nn.ModuleList(DecoderAttention(d_model, d) for _ in range(n_layers))
        self.generator = normed_linear(d, vocab_size, dropout)

    def forward(
        self, tgt_in: Tensor, keys: Tensor, values: Tensor, src_valid: Tensor, cache: ConvCache | None = None
    ) -> Tensor:
        state = cache if cache is not None else ConvCache()
        e = self.embed(tgt_in, self.embed.positions(state.length, tgt_in.shape[1], tgt_in.device))  # (B, T, D)
        h = self.fc_in(e)  # (B, T, C)
        for i, (conv, attention) in enumerate(zip(self.convs, self.attention)):
            x = self.past_and(state, i, self.dropout(h))  # (B, k - 1 + T, C)
            g = F.glu(conv(x.transpose(1, 2)), dim=1).transpose(1, 2)  # (B, T, C): position t sees t-k+1 .. t
            h = (attention(g, e, keys, values, src_valid) + h) * HALF
        state.length += tgt_in.shape[1]
        return self.generator(self.dropout(self.fc_out(h)))

    def past_and(self, state: ConvCache, layer: int, x: Tensor) -> Tensor:
        """Layer ``layer``'s last k - 1 inputs before x (zeros before the first), then x; kept in the state."""
        if len(state.inputs) == layer:
            state.inputs.append(x.new_zeros(x.shape[0], self.kernel_width - 1, x.shape[2]))
        state.inputs[layer] = torch.cat([state.inputs[layer], x], dim=1)
        return state.inputs[layer][:, -(self.kernel_width - 1 + x.shape[1]) :]


class ConvSeq2Seq(Seq2Seq):
    """Gehring et al.'s model with the EncoderDecoder interface: ``model(src, tgt_in)`` -> (B, T, V)
    logits; ``encode`` / ``decode(..., cache)`` / ``new_cache`` for decoding. The memory is the
    keys and the values side by side, (B, S, 2D)."""

    def __init__(self, encoder: ConvEncoder, decoder: ConvDecoder, pad_id: int) -> None:
        super().__init__()
        self.encoder, self.decoder, self.pad_id = encoder, decoder, pad_id

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        valid = src != self.pad_id
        return torch.cat(self.encoder(src, valid), dim=-1), valid

    def decode(
        self, tgt_in: Tensor, memory: Tensor, src_valid: Tensor, cache: ConvCache | None = None, last_only: bool = False
    ) -> Tensor:
        keys, values = memory.chunk(2, dim=-1)
        logits = self.decoder(tgt_in, keys, values, src_valid, cache)
        return logits[:, -1:] if last_only else logits

    def new_cache(self) -> ConvCache:
        return ConvCache()
