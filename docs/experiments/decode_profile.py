"""Where a decoding step of `attnlab bench decode` goes (docs/performance.md).

Runs the benchmark's greedy (batch 32) or 5-beam search (160 rows) for 64 new tokens under
PyTorch's profiler and prints the top operators. The matrix products (addmm: the layers' linear
maps; mm: the vocabulary projection; bmm: attention) set a floor under any implementation that
computes the same products in the same precision.

    .venv/bin/python docs/experiments/decode_profile.py greedy
    .venv/bin/python docs/experiments/decode_profile.py beam
"""

import sys
import time

import torch
from torch.profiler import profile

from attnlab.bench.reference import SHAPE
from attnlab.bench.train import attnlab_model
from attnlab.data.batching import source_batch
from attnlab.decode.search import beam_search, greedy

BATCH, NEW, SRC_LEN = 32, 64, 24


def main(mode: str) -> None:
    torch.manual_seed(0)
    model = attnlab_model(dropout=0.0).eval()
    g = torch.Generator().manual_seed(0)
    src = source_batch(torch.randint(4, SHAPE["vocab_size"], (BATCH, SRC_LEN - 1), generator=g).tolist())
    if mode == "greedy":
        def run():
            return greedy(model, src, max_len=NEW, min_len=NEW)
    else:
        def run():
            return beam_search(model, src, 5, 0.6, max_len=NEW, min_len=NEW)
    run()
    start = time.perf_counter()
    for _ in range(3):
        run()
    seconds = (time.perf_counter() - start) / 3
    print(f"{mode}: {BATCH * NEW / seconds:.0f} tokens/s, {1e3 * seconds / NEW:.2f} ms a step")
    with profile() as prof:
        run()
    table = prof.key_averages()
    gemm = sum(e.self_cpu_time_total for e in table if e.key in ("aten::addmm", "aten::mm", "aten::bmm"))
    print(f"matrix products: {gemm / 1e3 / NEW:.2f} ms a step")
    print(table.table(sort_by="self_cpu_time_total", row_limit=10))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "greedy")
