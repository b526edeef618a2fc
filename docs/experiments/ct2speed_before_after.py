"""Each change of issue 63's deliverable 2 against the code before it, on `attnlab bench decode`'s
model and sources (batch 32, 24-token sources, exactly 64 new tokens; beam 5, lenpen 0.6),
interleaved medians of 3 after a warm-up (docs/performance/decoding.md):

- int8 with the output projection quantised (decode/weights.py now) against int8 with it in
  float32 (every other linear layer quantised: the weights before), greedy and beam 5;
- beam search with its finished hypotheses on the device (decode/search.py at commit 877a0a3,
  read with `git show`; reverted after this measurement, docs/performance/decoding.md) against the search
  as it is (that of 50cae28), fp32; both must give the same hypotheses, tokens and scores to the
  bit, here and at natural lengths (no minimum length, 40 at most).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python docs/experiments/ct2speed_before_after.py
"""

import copy
import subprocess
import sys
import types
import warnings

import torch

from attnlab.bench.decode import decode_inputs
from attnlab.bench.timing import checked_length, interleaved_medians
from attnlab.decode import search
from attnlab.decode.weights import quantised_layers, with_weights

BATCH, NEW, SRC_LEN, BEAM = 32, 64, 24, 5
DEVICE_BOOKKEEPING = "877a0a3"


def search_at(commit: str) -> types.ModuleType:
    """decode/search.py as it was at ``commit``, as a module."""
    source = subprocess.run(
        ["git", "show", f"{commit}:attnlab/decode/search.py"], capture_output=True, text=True, check=True
    ).stdout
    module = types.ModuleType("search_before")
    sys.modules["search_before"] = module  # dataclasses look their module up
    exec(compile(source, "search_before.py", "exec"), module.__dict__)
    return module


def int8_before(model: torch.nn.Module) -> torch.nn.Module:
    """int8 as decode/weights.py made it before: every plain linear layer, the output projection in float32."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layers = {name: per_channel_dynamic_qconfig for name in quantised_layers(model)}
        return quantize_dynamic(model, layers, dtype=torch.qint8, inplace=True)


def main() -> None:
    model, src = decode_inputs(BATCH, SRC_LEN, seed=0)
    device_kept = search_at(DEVICE_BOOKKEEPING)
    with torch.no_grad():
        for kw in ({"max_len": NEW, "min_len": NEW}, {"max_len": 40}):
            mine = device_kept.beam_search(model, src, BEAM, 0.6, **kw)
            theirs = search.beam_search(model, src, BEAM, 0.6, **kw)
            assert [[vars(h) for h in s] for s in mine] == [[vars(h) for h in s] for s in theirs], kw
        print("beam 5 fp32, device bookkeeping: the same hypotheses, tokens and scores (fixed and natural lengths)")
    new8, old8 = with_weights(copy.deepcopy(model), "int8"), int8_before(copy.deepcopy(model))

    def greedy(m):
        return lambda: checked_length(search.greedy(m, src, max_len=NEW, min_len=NEW), NEW)

    def beam(m, s=search):
        return lambda: checked_length(
            [h[0].tokens for h in s.beam_search(m, src, BEAM, 0.6, max_len=NEW, min_len=NEW)], NEW
        )

    runs = {
        "greedy int8 (projection int8)": greedy(new8),
        "greedy int8 (projection fp32)": greedy(old8),
        "beam5 int8 (projection int8)": beam(new8),
        "beam5 int8 (projection fp32)": beam(old8),
        "beam5 fp32 (device bookkeeping)": beam(model, device_kept),
        "beam5 fp32 (before)": beam(model),
    }
    with torch.no_grad():
        seconds = interleaved_medians(runs, 3, warmup=1)
    for name, s in seconds.items():
        print(f"{name:34} {BATCH * NEW / s:9.1f} tokens/s")
    for a, b in [
        ("greedy int8 (projection int8)", "greedy int8 (projection fp32)"),
        ("beam5 int8 (projection int8)", "beam5 int8 (projection fp32)"),
        ("beam5 fp32 (device bookkeeping)", "beam5 fp32 (before)"),
    ]:
        print(f"{a} / {b}: x{seconds[b] / seconds[a]:.3f}")


if __name__ == "__main__":
    sys.exit(main())
