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
positions is nn/backends' ``attend``. :class:`RNNSeq2Seq` has the EncoderDecoder interface
(``encode``, ``decode`` with a cache, ``new_cache``), so training, greedy, beam search and sampling
work unchanged; the decoder's last attention weights are kept for alignment plots.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab.nn.dropout import Dropout
from attnlab.nn.encoder_decoder import Seq2Seq
from attnlab.nn.scores import AlignmentScore, attend


class RNNCache:
    """The decoder's state between steps: hidden (L, B, D), the LSTM cell (L, B, D), Luong's last
    attentional vector (B, D), the score's precomputed keys (B, S, Da) and the number of steps taken."""

    def __init__(self) -> None:
        self.hidden: Tensor | None = None
        self.cell: Tensor | None = None
        self.feed: Tensor | None = None
        self.keys: Tensor | None = None
        self.length = 0

    def reorder(self, index: Tensor, targets_only: bool = False) -> None:
        """Keep row ``index[i]`` as row i (beam search); with ``targets_only`` the rows share their
        source, so the source-side keys stay as they are."""
        if self.hidden is not None:
            self.hidden = self.hidden.index_select(1, index)
        if self.cell is not None:
            self.cell = self.cell.index_select(1, index)
        if self.feed is not None:
            self.feed = self.feed.index_select(0, index)
        if self.keys is not None and not targets_only:
            self.keys = self.keys.index_select(0, index)


def recur(rnn: nn.RNNBase, x: Tensor, state: RNNCache) -> Tensor:
    """Run ``rnn`` over (B, T, Din) inputs from the state's s_{t-1} (and cell): (B, T, D) top-layer
    states s_t; the state moves on."""
    lstm = isinstance(rnn, nn.LSTM)
    out, new = rnn(x, (state.hidden, state.cell) if lstm else state.hidden)
    state.hidden, state.cell = new if lstm else (new, None)
    state.length += x.shape[1]
    return out


class RNNEncoder(nn.Module):
    """With ``carries_final``, the memory also carries the RNN's final states (every layer's h, and c
    for an LSTM, after each row's last token) as its features from out_dim on, the same at every
    position: what a decoder that starts from them (:class:`LakeBaroniDecoder`) reads, passed
    through the encode / decode interface (and beam search's reordering) with the memory."""

    def __init__(
        self,
        embed: nn.Embedding,
        cell: type[nn.RNN] | type[nn.LSTM] | type[nn.GRU],
        d_model: int,
        n_layers: int,
        bidirectional: bool,
        dropout: float,
        embedding_dropout: float,
        carries_final: bool = False,
    ) -> None:
        super().__init__()
        self.embed, self.embed_dropout = embed, Dropout(embedding_dropout)
        self.rnn = cell(
            d_model,
            d_model,
            n_layers,
            batch_first=True,
            bidirectional=bidirectional,
            dropout=dropout if n_layers > 1 else 0.0,
        )
        self.d_model, self.bidirectional, self.carries_final = d_model, bidirectional, carries_final
        self.out_dim = d_model * (2 if bidirectional else 1)

    def forward(self, src: Tensor, valid: Tensor) -> Tensor:
        """(B, S) ids, (B, S) validity -> (B, S, out_dim) states h_i (zeros at padding), and with
        ``carries_final`` the final states after them: (B, S, out_dim + k L D), k = 2 for an LSTM."""
        lengths = valid.sum(1).clamp(min=1).cpu()  # an all-padding row still gets one step
        packed = pack_padded_sequence(
            self.embed_dropout(self.embed(src)), lengths, batch_first=True, enforce_sorted=False
        )
        states, final = self.rnn(packed)
        memory = pad_packed_sequence(states, batch_first=True, total_length=src.shape[1])[0]
        if not self.carries_final:
            return memory
        final = torch.cat(final if isinstance(final, tuple) else (final,))  # (k L, B, D): h, then c
        return torch.cat([memory, final.transpose(0, 1).flatten(1)[:, None].expand(-1, src.shape[1], -1)], dim=-1)

    def summary(self, memory: Tensor, valid: Tensor) -> Tensor:
        """(B, out_dim): the forward direction's state after the last real token, and the backward
        direction's after the first (each has then read the whole sentence)."""
        last = (valid.sum(1) - 1).clamp(min=0)
        forward = memory[torch.arange(memory.shape[0], device=memory.device), last, : self.d_model]
        return torch.cat([forward, memory[:, 0, self.d_model :]], dim=-1) if self.bidirectional else forward


class RNNDecoder(nn.Module):
    def __init__(
        self,
        embed: nn.Embedding,
        cell: type[nn.RNN] | type[nn.LSTM] | type[nn.GRU],
        d_model: int,
        d_memory: int,
        n_layers: int,
        attention: str,
        score: AlignmentScore | None,
        input_feeding: bool,
        dropout: float,
        embedding_dropout: float,
    ) -> None:
        super().__init__()
        self.embed, self.embed_dropout, self.dropout = embed, Dropout(embedding_dropout), Dropout(dropout)
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

    def start(self, state: RNNCache, summary: Tensor, memory: Tensor) -> None:
        s0 = torch.tanh(self.init(summary))  # (B, D)
        state.hidden = s0[None].repeat(self.n_layers, 1, 1).contiguous()
        state.cell = torch.zeros_like(state.hidden) if self.lstm else None
        state.feed = torch.zeros_like(s0) if self.input_feeding else None
        state.keys = self.score.keys(memory) if self.score is not None else None  # once per sentence

    def recur(self, x: Tensor, state: RNNCache) -> Tensor:
        return recur(self.rnn, x, state)

    def align(self, s: Tensor, state: RNNCache, memory: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """(B, T, D) queries over (B, S, Dm) memory -> contexts c (B, T, Dm), weights alpha (B, T, S)."""
        assert self.score is not None and state.keys is not None  # a decoder that attends: start() made the keys
        return attend(self.score.compare(s, state.keys), memory, mask)

    def forward(
        self, tokens: Tensor, memory: Tensor, summary: Tensor, memory_valid: Tensor, cache: RNNCache | None = None
    ) -> Tensor:
        """(B, T) target tokens y_{t-1} (only the new ones, with a cache) -> (B, T, D) output vectors o_t.
        Where the recurrence does not depend on attention (fixed context; Luong without input
        feeding) the RNN runs over all T steps in one call; otherwise step by step."""
        state = cache if cache is not None else RNNCache()
        if state.hidden is None:
            self.start(state, summary, memory)
        e = self.embed_dropout(self.embed(tokens))  # (B, T, D): E y_{t-1}
        mask = memory_valid[:, None, :]  # (B, 1, S)
        if self.attention == "luong":
            h_tilde, self.last_attention = self._luong(e, state, memory, mask)
            return self.dropout(h_tilde)
        if self.attention == "none":
            c = summary[:, None].expand(-1, e.shape[1], -1)  # the same c at every step
            s = self.recur(torch.cat([e, c], dim=-1), state)
            self.last_attention = None
        else:  # Bahdanau: scores from s_{t-1}, c_t enters the recurrence
            s_steps, c_steps, w_steps = [], [], []
            assert state.hidden is not None  # start() has set it
            for t in range(e.shape[1]):
                c_t, w_t = self.align(state.hidden[-1][:, None], state, memory, mask)
                s_steps.append(self.recur(torch.cat([e[:, t : t + 1], c_t], dim=-1), state))
                c_steps.append(c_t)
                w_steps.append(w_t)
            s, c, self.last_attention = torch.cat(s_steps, 1), torch.cat(c_steps, 1), torch.cat(w_steps, 1)
        return self.dropout(torch.tanh(self.W_o(torch.cat([s, c, e], dim=-1))))  # o_t = tanh(W_o [s_t; c_t; E y])

    def _luong(self, e: Tensor, state: RNNCache, memory: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Luong's attentional states h~_t = tanh(W_c [c_t; s_t]) (B, T, D) and weights (B, T, S):
        all steps in one call, or step by step when h~_{t-1} is fed into the recurrence."""
        if not self.input_feeding:
            s = self.recur(e, state)
            c, weights = self.align(s, state, memory, mask)
            return torch.tanh(self.W_c(torch.cat([c, s], dim=-1))), weights
        h_steps, w_steps = [], []
        assert state.feed is not None  # start() has set it: input feeding
        for t in range(e.shape[1]):
            s_t = self.recur(torch.cat([e[:, t : t + 1], state.feed[:, None]], dim=-1), state)
            c_t, w_t = self.align(s_t, state, memory, mask)
            h_steps.append(torch.tanh(self.W_c(torch.cat([c_t, s_t], dim=-1))))
            w_steps.append(w_t)
            state.feed = h_steps[-1][:, 0]
        return torch.cat(h_steps, 1), torch.cat(w_steps, 1)


class LakeBaroniDecoder(nn.Module):
    """The decoder of Lake & Baroni (2018), who built on PyTorch's seq2seq tutorial: it starts from
    the encoder's final states (every layer's h, and c for an LSTM: ``carries_final``), reads E y_{t-1},
    with attention also c_t (Bahdanau's: e_ti = score(s_{t-1}, h_i) over the top layer's s_{t-1}),
    and predicts from its top state alone:

        s_t = RNN(s_{t-1}, E y_{t-1})  or  RNN(s_{t-1}, [E y_{t-1}; c_t]),   p(y_t) = softmax(W_out s_t)

    with no learnt initial state, no context outside attention, and no deep output layer. Dropout on
    the embeddings (``embedding_dropout``) and between layers (``dropout``)."""

    def __init__(
        self,
        embed: nn.Embedding,
        cell: type[nn.RNN] | type[nn.LSTM] | type[nn.GRU],
        d_model: int,
        n_layers: int,
        score: AlignmentScore | None,
        dropout: float,
        embedding_dropout: float,
    ) -> None:
        super().__init__()
        self.embed, self.embed_dropout, self.score = embed, Dropout(embedding_dropout), score
        self.lstm, self.n_layers, self.d_model = cell is nn.LSTM, n_layers, d_model
        d_in = d_model * (2 if score is not None else 1)
        self.rnn = cell(d_in, d_model, n_layers, batch_first=True, dropout=dropout if n_layers > 1 else 0.0)
        self.last_attention: Tensor | None = None  # (B, T, S) of the last call, for alignment plots

    def start(self, state: RNNCache, memory: Tensor) -> None:
        final = torch.unflatten(memory[:, 0, self.d_model :], 1, (-1, self.d_model)).transpose(0, 1)  # (k L, B, D)
        state.hidden = final[: self.n_layers].contiguous()
        state.cell = final[self.n_layers :].contiguous() if self.lstm else None
        state.keys = self.score.keys(memory[..., : self.d_model]) if self.score is not None else None

    def forward(
        self, tokens: Tensor, memory: Tensor, summary: Tensor, memory_valid: Tensor, cache: RNNCache | None = None
    ) -> Tensor:
        """(B, T) target tokens y_{t-1} (only the new ones, with a cache) -> (B, T, D) top states s_t."""
        state = cache if cache is not None else RNNCache()
        if state.hidden is None:
            self.start(state, memory)
        e = self.embed_dropout(self.embed(tokens))  # (B, T, D): E y_{t-1}
        if self.score is None:
            return recur(self.rnn, e, state)
        h, mask = memory[..., : self.d_model], memory_valid[:, None, :]  # (B, S, D) h_i, (B, 1, S)
        s_steps, w_steps = [], []
        assert state.hidden is not None and state.keys is not None  # start() has set them
        for t in range(e.shape[1]):
            c_t, w_t = attend(self.score.compare(state.hidden[-1][:, None], state.keys), h, mask)  # from s_{t-1}
            s_steps.append(recur(self.rnn, torch.cat([e[:, t : t + 1], c_t], dim=-1), state))
            w_steps.append(w_t)
        self.last_attention = torch.cat(w_steps, 1)
        return torch.cat(s_steps, 1)


class RNNSeq2Seq(Seq2Seq):
    """A recurrent encoder-decoder with the EncoderDecoder interface. ``model(src, tgt_in)`` ->
    (B, T, V) logits; ``encode`` / ``decode(..., cache)`` / ``new_cache`` for decoding.

    In training, each sequence is teacher-forced with probability ``teacher_forcing`` (one coin per
    sequence, from torch's CPU generator, which checkpoints keep); the others are decoded
    free-running: step t reads the argmax of step t - 1's logits, a choice no gradient passes
    through, while every step's loss counts (Lake & Baroni 2018: 0.5)."""

    def __init__(
        self,
        encoder: RNNEncoder,
        decoder: RNNDecoder | LakeBaroniDecoder,
        generator: nn.Linear,
        pad_id: int,
        teacher_forcing: float = 1.0,
    ) -> None:
        super().__init__()
        self.encoder, self.decoder, self.generator = encoder, decoder, generator
        self.pad_id, self.teacher_forcing = pad_id, teacher_forcing

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """(B, S) source, (B, T) decoder inputs BOS y_1 ... y_{T-1} -> (B, T, V) logits."""
        if not self.training or self.teacher_forcing >= 1.0:
            return super().forward(src, tgt_in)
        forced = torch.rand(src.shape[0]) < self.teacher_forcing  # (B,) on the host: no device sync
        if forced.all():
            return super().forward(src, tgt_in)
        return self.free_running(src, tgt_in, forced.to(src.device))

    def free_running(self, src: Tensor, tgt_in: Tensor, forced: Tensor) -> Tensor:
        """(B, T, V) logits, step by step: row b reads the true y_{t-1} where ``forced[b]`` (B,), and
        otherwise its own previous step's choice: the argmax over the tokens decoding can emit (not
        padding, not the start token BOS that every tgt_in begins with), an integer, so no gradient
        passes through the choice itself."""
        memory, src_valid = self.encode(src)
        cache, steps = self.new_cache(), []
        token = tgt_in[:, :1]  # (B, 1): BOS
        never = torch.zeros(*token.shape, self.generator.out_features, dtype=torch.bool, device=src.device)
        never[..., self.pad_id] = True
        never.scatter_(-1, token[..., None], True)  # (B, 1, V)
        for t in range(tgt_in.shape[1]):
            steps.append(self.decode(token, memory, src_valid, cache))  # (B, 1, V)
            if t + 1 < tgt_in.shape[1]:
                choice = steps[-1].masked_fill(never, -torch.inf).argmax(-1)  # (B, 1)
                token = torch.where(forced[:, None], tgt_in[:, t + 1 : t + 2], choice)
        return torch.cat(steps, dim=1)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        valid = src != self.pad_id
        return self.encoder(src, valid), valid

    def decode(
        self, tgt_in: Tensor, memory: Tensor, src_valid: Tensor, cache: RNNCache | None = None, last_only: bool = False
    ) -> Tensor:
        summary = self.encoder.summary(memory, src_valid)
        o = self.decoder(tgt_in, memory, summary, src_valid, cache)  # (B, T, D)
        return self.generator(o[:, -1:] if last_only else o)

    def new_cache(self) -> RNNCache:
        return RNNCache()
