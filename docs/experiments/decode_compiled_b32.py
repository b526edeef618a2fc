"""Greedy decoding at batch 32 (the model and sources of `attnlab bench decode`, 64 new tokens) with
the growable cache, the static cache and the compiled one-token step (kv_cache dynamic, static,
compiled): does compiling the step pay where the step is mostly matrix products? One thread.

    OMP_NUM_THREADS=1 .venv/bin/python docs/experiments/decode_compiled_b32.py
"""

import time

import torch

from attnlab.bench.decode import decode_inputs
from attnlab.bench.timing import interleaved_medians
from attnlab.decode.search import greedy

torch.set_num_threads(1)
model, src = decode_inputs(32, 24, 0)
runs = {
    k: (lambda k: lambda: greedy(model, src, max_len=64, min_len=64, kv_cache=k))(k)
    for k in ("dynamic", "static", "compiled")
}
started = time.time()
with torch.no_grad():
    assert greedy(model, src, max_len=64, min_len=64, kv_cache="compiled") == greedy(
        model, src, max_len=64, min_len=64, kv_cache="dynamic"
    )
    print("compile+check", round(time.time() - started, 1))
    s = interleaved_medians(runs, 3, warmup=1)
for kind, seconds in s.items():
    print(kind, round(32 * 64 / seconds), "tokens/s")
