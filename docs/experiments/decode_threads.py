"""How the intra-op threads wait decides a decoding step's time on a shared CPU (docs/performance/decoding.md).

Greedy decoding of `attnlab bench decode`'s model and sources (batch 32, 24-token sources), 16 new
tokens after a 4-token warm-up, twice, in ms a step, with torch's threads as the environment sets
them. Run it under each setting, one after the other:

    .venv/bin/python docs/experiments/decode_threads.py                         # 2 threads, spinning waits
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python docs/experiments/decode_threads.py # 2 threads, sleeping waits
    OMP_NUM_THREADS=1 .venv/bin/python docs/experiments/decode_threads.py       # 1 thread

OMP_WAIT_POLICY is read by the OpenMP runtime when torch loads it, so it is set in the environment,
not from Python.
"""

import os
import time

import torch

from attnlab.bench.decode import decode_inputs
from attnlab.decode.search import greedy

model, src = decode_inputs(32, 24, 0)
with torch.no_grad():
    greedy(model, src, max_len=4, min_len=4)
    for _ in range(2):
        started = time.perf_counter()
        greedy(model, src, max_len=16, min_len=16)
        print(
            f"threads {torch.get_num_threads()}, OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', '(unset)')}: "
            f"{(time.perf_counter() - started) / 16 * 1e3:.1f} ms a step"
        )
