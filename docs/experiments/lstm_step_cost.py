"""What a free-running sequence costs Lake & Baroni's LSTM on a CPU (docs/claims/scan_lake_baroni.md, issue 41).

With batch 1 and teacher forcing on half the sequences, a free-running sequence calls nn.LSTM once a
step (nn/rnn.py, RNNSeq2Seq.free_running), where a teacher-forced one calls it once for the whole
sequence. This times, forward and backward, one thread, the overall-best model's 2 x 200 LSTM over
30 steps of batch 1: one call over the sequence, 30 one-step calls (with oneDNN, PyTorch's default
on a CPU, and without), and the same 30 steps as explicit gates (addmm, sigmoid, tanh; no dropout
between the layers, so a timing, not the model). With ``--updates N``, it also trains the overall-best
recipe (simple split) for N updates twice and prints each training's CPU time: as it is, and with
oneDNN left out of the free-running loop alone (the teacher-forced calls keep it):

    OMP_NUM_THREADS=1 .venv/bin/python docs/experiments/lstm_step_cost.py [--updates 1000]

A measurement aid; nothing imports it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from attnlab.cli.main import main as attnlab
from attnlab.nn.rnn import RNNSeq2Seq

STEPS, WIDTH, LAYERS = 30, 200, 2


def milliseconds(fn: Callable[[], None], repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


@contextmanager
def native_free_running() -> Iterator[None]:
    """RNNSeq2Seq.free_running with oneDNN off for its one-step calls (and their backward)."""
    free_running = RNNSeq2Seq.free_running

    def without_onednn(self: RNNSeq2Seq, *args: torch.Tensor) -> torch.Tensor:
        with torch.backends.mkldnn.flags(enabled=False):
            return free_running(self, *args)

    RNNSeq2Seq.free_running = without_onednn
    try:
        yield
    finally:
        RNNSeq2Seq.free_running = free_running


def training_cpu_seconds(updates: int) -> float:
    """CPU seconds of `attnlab train` on the overall-best recipe for ``updates`` updates (the data's
    generation, the model's construction and the final validation included)."""
    start = time.process_time()
    with tempfile.TemporaryDirectory() as out:
        attnlab(
            [
                "train",
                "recipes/scan/lake_baroni_overall.yaml",
                "--out",
                f"{out}/run",
                "--set",
                f"train.max_steps={updates}",
                "--set",
                "train.progress=false",
            ]
        )
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, help="also time this many updates of the recipe, both ways")
    args = parser.parse_args()
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
            out, state = lstm(x[:, t : t + 1], state)
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
    if args.updates:
        as_is = training_cpu_seconds(args.updates)
        with native_free_running():
            native = training_cpu_seconds(args.updates)
        print(f"{args.updates:,} updates of recipes/scan/lake_baroni_overall.yaml, CPU seconds:")
        print(f"  as it is                                  {as_is:7.2f}")
        print(f"  oneDNN off in the free-running loop       {native:7.2f}  (x{as_is / native:.2f})")


if __name__ == "__main__":
    main()
