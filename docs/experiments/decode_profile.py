"""Where a decoding step of `attnlab bench decode` goes (docs/performance.md).

Times the benchmark's greedy (batch 32) or 5-beam search (160 rows) for 64 new tokens (median of
3 runs after a warm-up, as `bench decode` times them), then runs it once under PyTorch's profiler
and prints the top operators. The matrix products (addmm: the layers' linear
maps; mm: the vocabulary projection; bmm: attention) set a floor under any implementation that
computes the same products in the same precision.

    .venv/bin/python docs/experiments/decode_profile.py greedy
    .venv/bin/python docs/experiments/decode_profile.py beam
"""

import sys

from torch.profiler import profile

from attnlab.bench.decode import decode_inputs
from attnlab.bench.timing import checked_length, interleaved_medians
from attnlab.decode.search import beam_search, greedy

BATCH, NEW, SRC_LEN = 32, 64, 24


def main(mode: str) -> None:
    model, src = decode_inputs(BATCH, SRC_LEN, seed=0)
    if mode == "greedy":
        def run():
            checked_length(greedy(model, src, max_len=NEW, min_len=NEW), NEW)
    else:
        def run():
            checked_length([h[0].tokens for h in beam_search(model, src, 5, 0.6, max_len=NEW, min_len=NEW)], NEW)
    seconds = interleaved_medians({"run": run}, 3, warmup=1)["run"]
    print(f"{mode}: {BATCH * NEW / seconds:.0f} tokens/s, {1e3 * seconds / NEW:.2f} ms a step")
    with profile() as prof:
        run()
    table = prof.key_averages()
    gemm = sum(e.self_cpu_time_total for e in table if e.key in ("aten::addmm", "aten::mm", "aten::bmm"))
    print(f"matrix products: {gemm / 1e3 / NEW:.2f} ms a step")
    print(table.table(sort_by="self_cpu_time_total", row_limit=10))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "greedy")
