"""What a free-running sequence costs Lake & Baroni's LSTM on a CPU (docs/claims.md, issue 41).

With batch 1 and teacher forcing on half the sequences, a free-running sequence calls nn.LSTM once a
step (nn/rnn.py, RNNSeq2Seq.free_running), where a teacher-forced one calls it once for the whole
sequence. This times, forward and backward, one thread, the overall-best model's 2 x 200 LSTM over
30 steps of batch 1: one call over the sequence, 30 one-step calls (with oneDNN, PyTorch's default
on a CPU, and without), and the same 30 steps as explicit gates (addmm, sigmoid, tanh; no dropout
between the layers, so a timing, not the model):

    OMP_NUM_THREADS=1 .venv/bin/python docs/experiments/lstm_step_cost.py

A measurement aid; nothing imports it.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

STEPS, WIDTH, LAYERS = 30, 200, 2


def milliseconds(fn: Callable[[], None], repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(WIDTH, WIDTH, LAYERS, batch_first=True, dropout=0.5)
    x = torch.randn(1, STEPS, WIDTH)  # (B, T, D)

    def whole() -> None:
        out, _ = lstm(x)
        out.sum().backward()

    def one_step_calls() -> None:
        state, outs = None, []
        for t in range(STEPS):
            out, state = lstm(x[:, t: t + 1], state)
            outs.append(out)
        torch.cat(outs, 1).sum().backward()

    def explicit_gates() -> None:
        h = [torch.zeros(1, WIDTH) for _ in range(LAYERS)]
        c = [torch.zeros(1, WIDTH) for _ in range(LAYERS)]
        outs = []
        for t in range(STEPS):
            inp = x[:, t]
            for layer in range(LAYERS):
                w_ih, w_hh = getattr(lstm, f"weight_ih_l{layer}"), getattr(lstm, f"weight_hh_l{layer}")
                bias = getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")
                i, f, g, o = (torch.addmm(bias, inp, w_ih.t()) + h[layer] @ w_hh.t()).chunk(4, 1)
                c[layer] = torch.sigmoid(f) * c[layer] + torch.sigmoid(i) * torch.tanh(g)
                h[layer] = inp = torch.sigmoid(o) * torch.tanh(c[layer])
            outs.append(inp)
        torch.stack(outs, 1).sum().backward()

    print(f"{LAYERS} x {WIDTH} LSTM, {STEPS} steps of batch 1, forward + backward, ms:")
    print(f"  one call over the sequence (oneDNN)  {milliseconds(whole):7.2f}")
    print(f"  {STEPS} one-step calls (oneDNN)          {milliseconds(one_step_calls):7.2f}")
    with torch.backends.mkldnn.flags(enabled=False):
        print(f"  one call over the sequence (native)  {milliseconds(whole):7.2f}")
        print(f"  {STEPS} one-step calls (native)          {milliseconds(one_step_calls):7.2f}")
    print(f"  {STEPS} steps as explicit gates           {milliseconds(explicit_gates):7.2f}")


if __name__ == "__main__":
    main()
