"""Recurrent encoder-decoders: the models the Transformer replaced, on the same interface.

Encoder: embeddings -> RNN / LSTM / GRU, uni- or bidirectional, several layers, packed so that
padding is never read. The decoder starts from s_0 = tanh(W_init [h_last_forward; h_first_backward])
and, per step, from the previous target token y_{t-1}:

fixed context (Cho et al. 2014)  c = the encoder summary for every step;
                                 s_t = RNN(s_{t-1}, [E y_{t-1}; c]),  o_t = tanh(W_o [s_t; c; E y_{t-1}])
Bahdanau et al. (2015)           e_ti = score(s_{t-1}, h_i), c_t = sum_i alpha_ti h_i;
                                 s_t = RNN(s_{t-1}, [E y_{t-1}; c_t]), o_t = tanh(W_o [s_t; c_t; E y_{t-1}])
Luong et al. (2015)              s_t = RNN(s_{t-1}, [E y_{t-1}; h~_{t-1}]) (input feeding) or RNN(s_{t-1}, E y_{t-1});
                                 e_ti = score(s_t, h_i), c_t = sum_i alpha_ti h_i, o_t = h~_t = tanh(W_c [c_t; s_t])

and p(y_t) = softmax(W_out o_t). The score functions are nn/scores.py's; the softmax over source
positions is nn/attention.py's ``attend``. :class:`RNNSeq2Seq` has the EncoderDecoder interface
(``encode``, ``decode`` with a cache, ``new_cache``), so training, greedy, beam search and sampling
work unchanged; the decoder's last attention weights are kept for alignment plots.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab.nn.attention import attend
from attnlab.nn.scores import AlignmentScore
from attnlab.nn.transformer import Seq2Seq


class RNNCache:
    """The decoder's state between steps: hidden (L, B, D), the LSTM cell (L, B, D), Luong's last
    attentional vector (B, D), and the number of steps taken."""

    def __init__(self) -> None:
        self.hidden: Tensor | None = None
        self.cell: Tensor | None = None
        self.feed: Tensor | None = None
        self.length = 0

    def reorder(self, index: Tensor, targets_only: bool = False) -> None:
        """Keep row ``index[i]`` as row i (beam search); the state has no source part to spare."""
        if self.hidden is not None:
            self.hidden = self.hidden.index_select(1, index)
        if self.cell is not None:
            self.cell = self.cell.index_select(1, index)
        if self.feed is not None:
            self.feed = self.feed.index_select(0, index)


class RNNEncoder(nn.Module):
    def __init__(self, embed: nn.Embedding, cell: type[nn.RNNBase], d_model: int, n_layers: int,
                 bidirectional: bool, dropout: float) -> None:
        super().__init__()
        self.embed, self.dropout = embed, nn.Dropout(dropout)
        self.rnn = cell(d_model, d_model, n_layers, batch_first=True, bidirectional=bidirectional,
                        dropout=dropout if n_layers > 1 else 0.0)
        self.d_model, self.bidirectional = d_model, bidirectional
        self.out_dim = d_model * (2 if bidirectional else 1)

    def forward(self, src: Tensor, valid: Tensor) -> Tensor:
        """(B, S) ids, (B, S) validity -> (B, S, out_dim) states h_i (zeros at padding)."""
        lengths = valid.sum(1).clamp(min=1).cpu()  # an all-padding row still gets one step
        packed = pack_padded_sequence(self.dropout(self.embed(src)), lengths, batch_first=True, enforce_sorted=False)
        states, _ = self.rnn(packed)
        return pad_packed_sequence(states, batch_first=True, total_length=src.shape[1])[0]

    def summary(self, memory: Tensor, valid: Tensor) -> Tensor:
        """(B, out_dim): the forward direction's state after the last real token, and the backward
        direction's after the first (each has then read the whole sentence)."""
        last = (valid.sum(1) - 1).clamp(min=0)
        forward = memory[torch.arange(memory.shape[0], device=memory.device), last, : self.d_model]
        return torch.cat([forward, memory[:, 0, self.d_model:]], dim=-1) if self.bidirectional else forward


class RNNDecoder(nn.Module):
    def __init__(self, embed: nn.Embedding, cell: type[nn.RNNBase], d_model: int, d_memory: int, n_layers: int,
                 attention: str, score: AlignmentScore | None, input_feeding: bool, dropout: float) -> None:
        super().__init__()
        self.embed, self.dropout = embed, nn.Dropout(dropout)
        self.attention, self.score = attention, score
        self.input_feeding = attention == "luong" and input_feeding
        self.lstm = cell is nn.LSTM
        self.n_layers = n_layers
        self.init = nn.Linear(d_memory, d_model)  # s_0 = tanh(W_init summary)
        extra = {"none": d_memory, "bahdanau": d_memory, "luong": d_model if self.input_feeding else 0}[attention]
        self.rnn = cell(d_model + extra, d_model, n_layers, batch_first=True, dropout=dropout if n_layers > 1 else 0.0)
        if attention == "luong":
            self.W_c = nn.Linear(d_memory + d_model, d_model)  # h~_t = tanh(W_c [c_t; s_t])
        else:
            self.W_o = nn.Linear(d_model + d_memory + d_model, d_model)  # o_t = tanh(W_o [s_t; c_t; E y])
        self.last_attention: Tensor | None = None  # (B, T, S) of the last call, for alignment plots

    def start(self, state: RNNCache, summary: Tensor) -> None:
        s0 = torch.tanh(self.init(summary))  # (B, D)
        state.hidden = s0[None].repeat(self.n_layers, 1, 1).contiguous()
        state.cell = torch.zeros_like(state.hidden) if self.lstm else None
        state.feed = torch.zeros_like(s0) if self.input_feeding else None

    def _attend(self, query: Tensor, memory: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """(B, D) query over (B, S, Dm) memory -> context (B, Dm), weights (B, S)."""
        context, weights = attend(self.score(query[:, None], memory), memory, mask)  # (B, 1, Dm), (B, 1, S)
        return context[:, 0], weights[:, 0]

    def step(self, y_prev: Tensor, state: RNNCache, memory: Tensor, mask: Tensor,
             summary: Tensor) -> tuple[Tensor, Tensor | None]:
        """One decoder step from the (B,) previous tokens: the output vector o_t (B, D) and the
        attention weights (B, S) (None for the fixed context). Updates ``state`` in place."""
        e = self.dropout(self.embed(y_prev))  # (B, D)
        weights = None
        if self.attention == "bahdanau":
            context, weights = self._attend(state.hidden[-1], memory, mask)  # scores from s_{t-1}
            x = torch.cat([e, context], dim=-1)
        elif self.attention == "none":
            context = summary
            x = torch.cat([e, context], dim=-1)
        else:
            x = torch.cat([e, state.feed], dim=-1) if self.input_feeding else e
        recurrent = (state.hidden, state.cell) if self.lstm else state.hidden
        out, new = self.rnn(x[:, None], recurrent)
        state.hidden, state.cell = (new if self.lstm else (new, None))
        state.length += 1
        s = out[:, 0]  # (B, D): the top layer's s_t
        if self.attention == "luong":
            context, weights = self._attend(s, memory, mask)  # scores from s_t
            h_tilde = torch.tanh(self.W_c(torch.cat([context, s], dim=-1)))
            if self.input_feeding:
                state.feed = h_tilde
            return self.dropout(h_tilde), weights
        return self.dropout(torch.tanh(self.W_o(torch.cat([s, context, e], dim=-1)))), weights

    def forward(self, tokens: Tensor, memory: Tensor, summary: Tensor, memory_valid: Tensor,
                cache: RNNCache | None = None) -> Tensor:
        """(B, T) target tokens (only the new ones, with a cache) -> (B, T, D) output vectors."""
        state = cache if cache is not None else RNNCache()
        if state.hidden is None:
            self.start(state, summary)
        mask = memory_valid[:, None, :]  # (B, 1, S)
        outputs, weights = [], []
        for t in range(tokens.shape[1]):
            o, w = self.step(tokens[:, t], state, memory, mask, summary)
            outputs.append(o)
            weights.append(w)
        self.last_attention = torch.stack(weights, dim=1) if weights and weights[0] is not None else None
        return torch.stack(outputs, dim=1)


class RNNSeq2Seq(Seq2Seq):
    """A recurrent encoder-decoder with the EncoderDecoder interface. ``model(src, tgt_in)`` ->
    (B, T, V) logits; ``encode`` / ``decode(..., cache)`` / ``new_cache`` for decoding."""

    def __init__(self, encoder: RNNEncoder, decoder: RNNDecoder, generator: nn.Linear, pad_id: int) -> None:
        super().__init__()
        self.encoder, self.decoder, self.generator = encoder, decoder, generator
        self.pad_id = pad_id

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        valid = src != self.pad_id
        return self.encoder(src, valid), valid

    def decode(self, tgt_in: Tensor, memory: Tensor, src_valid: Tensor, cache: RNNCache | None = None) -> Tensor:
        summary = self.encoder.summary(memory, src_valid)
        return self.generator(self.decoder(tgt_in, memory, summary, src_valid, cache))

    def new_cache(self) -> RNNCache:
        return RNNCache()
