"""Where a decoding step of `attnlab bench decode` goes (docs/performance/decoding.md), per family of work.

Times the benchmark's greedy (batch 32) or 5-beam search (160 rows) for 64 new tokens (median of
3 runs after a warm-up, as `bench decode` times them), with fp32 or int8 weights, then runs it once
under PyTorch's profiler (CPU) with every part of the model and of the search marked by a
``record_function`` range (module hooks; the search's cache writes, reorders, log-softmax and
top-k wrapped here, nothing changed in attnlab). Each operator's own CPU time goes to the innermost
range around it: the matrix products of each projection (self-attention W^Q|W^K|W^V and W^O,
cross-attention W^Q, W^K|W^V (once per sentence) and W^O, the FFN's W_1 and W_2, the output
projection), the attention arithmetic, norms and residuals, cache writes, the beam's cache
reorder, log-softmax, argmax / top-k, the rest of the search's bookkeeping, the encoder (once).
"Python" is the time a range spends outside any operator: the interpreter and the dispatcher.
The profiler's own cost inflates the small operators, so the table prints both the profiled and
the unprofiled milliseconds a step, and each family's share of the profiled step.

    .venv/bin/python docs/experiments/decode_profile.py greedy fp32
    .venv/bin/python docs/experiments/decode_profile.py beam int8
"""

import sys
import time
from collections import defaultdict
from contextlib import contextmanager

import torch
from torch.profiler import profile, record_function

from attnlab.bench.decode import decode_inputs
from attnlab.bench.timing import checked_length, interleaved_medians
from attnlab.decode import search, session
from attnlab.decode.weights import with_weights
from attnlab.nn import cache

BATCH, NEW, SRC_LEN, BEAM = 32, 64, 24, 5
PREFIX = "family: "

# the innermost module whose name ends so names the family (first match wins)
MODULES = [
    ("self_attn.qkv_proj", "self-attn W^Q|W^K|W^V"),
    ("self_attn.out_proj", "self-attn W^O"),
    ("cross_attn.q_proj", "cross-attn W^Q"),
    ("cross_attn.kv_proj", "cross-attn W^K|W^V (once)"),
    ("cross_attn.out_proj", "cross-attn W^O"),
    ("feed_forward.w_1", "FFN W_1"),
    ("feed_forward.w_2", "FFN W_2"),
    ("generator", "output projection"),
    ("self_attn", "self-attention arithmetic"),
    ("cross_attn", "cross-attention arithmetic"),
    ("_residual", "norms and residuals"),
    ("tgt_embed", "embeddings"),
    ("decoder", "decoder (masks, glue)"),
]


def family_of(name: str) -> str | None:
    if name.startswith(("encoder", "src_embed")):
        return "encoder (once)" if name in ("encoder", "src_embed") else None
    for suffix, family in MODULES:
        if name.endswith(suffix):
            return family
    return None


def mark_modules(model: torch.nn.Module) -> None:
    """A record_function range around every module that names a family."""
    for name, module in model.named_modules():
        family = family_of(name)
        if family is None:
            continue
        ranges: list = []

        def enter(mod, args, family=family, ranges=ranges):
            ranges.append(record_function(PREFIX + family))
            ranges[-1].__enter__()

        def leave(mod, args, out, ranges=ranges):
            ranges.pop().__exit__(None, None, None)

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)


def wrapped(owner, attr: str, family: str) -> None:
    """``owner.attr`` (a function or method) run inside a range of ``family``."""
    original = getattr(owner, attr)

    def run(*args, **kwargs):
        with record_function(PREFIX + family):
            return original(*args, **kwargs)

    setattr(owner, attr, run)


def mark_search() -> None:
    for kind in (cache.KVCache, cache.StaticKVCache):
        wrapped(kind, "append", "cache writes")
    wrapped(session.DecodingSession, "reorder", "cache reorder (beam)")
    wrapped(session, "token_logprobs", "log-softmax")


@contextmanager
def search_range():
    with record_function(PREFIX + "search bookkeeping"):
        yield


def breakdown(prof) -> tuple[dict[str, float], dict[str, float]]:
    """(family -> operators' own microseconds, family -> Python microseconds) over the profiled run."""
    ops: dict[str, float] = defaultdict(float)
    python: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.name.startswith(PREFIX):
            python[event.name[len(PREFIX) :]] += event.self_cpu_time_total
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith(PREFIX):
            parent = parent.cpu_parent
        family = parent.name[len(PREFIX) :] if parent is not None else "outside the search"
        if family == "search bookkeeping" and event.name in ("aten::topk", "aten::argmax", "aten::max"):
            family = "argmax / top-k"
        ops[family] += event.self_cpu_time_total
    return ops, python


def main(mode: str, weights: str) -> None:
    model, src = decode_inputs(BATCH, SRC_LEN, seed=0)
    model = with_weights(model, weights)
    rows = BATCH if mode == "greedy" else BATCH * BEAM

    def run():
        if mode == "greedy":
            checked_length(search.greedy(model, src, max_len=NEW, min_len=NEW), NEW)
        else:
            out = search.beam_search(model, src, BEAM, 0.6, max_len=NEW, min_len=NEW)
            checked_length([h[0].tokens for h in out], NEW)

    seconds = interleaved_medians({"run": run}, 3, warmup=1)["run"]
    print(
        f"{mode} {weights}, {rows} rows: {BATCH * NEW / seconds:.0f} tokens/s, {1e3 * seconds / NEW:.2f} ms a step"
        f" (torch threads {torch.get_num_threads()})"
    )
    mark_modules(model)
    mark_search()
    with profile() as prof:
        started = time.perf_counter()
        with search_range():
            run()
        profiled = time.perf_counter() - started
    ops, python = breakdown(prof)
    total = 1e6 * profiled
    print(f"profiled: {1e3 * profiled / NEW:.2f} ms a step (unprofiled {1e3 * seconds / NEW:.2f})")
    print(f"{'family':34} {'ops ms/step':>11} {'Python ms/step':>14} {'share':>6}")
    for family in sorted(set(ops) | set(python), key=lambda f: -(ops[f] + python[f])):
        share = (ops[family] + python[family]) / total
        print(f"{family:34} {ops[family] / 1e3 / NEW:11.3f} {python[family] / 1e3 / NEW:14.3f} {share:6.1%}")
    products = sum(
        e.self_cpu_time_total
        for e in prof.key_averages()
        if e.key
        in (
            "aten::addmm",
            "aten::mm",
            "aten::bmm",
            "quantized::linear_dynamic",
            "aten::_weight_int8pack_mm",
            "aten::baddbmm",
            "aten::matmul",
        )
    )
    print(f"all matrix products: {products / 1e3 / NEW:.2f} ms a step")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "greedy", sys.argv[2] if len(sys.argv) > 2 else "fp32")
