"""What each suite of `attnlab bench` runs (train, its --shape, decode, lm, models, encoder, gpt2,
attention): the checks of its options, a header that says what it measures and on which device, and
its figures, one line each (or JSON); the command line that reaches them is cli/bench.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlab.cli.common import check_new_file, emit
from attnlab.errors import UsageError

if TYPE_CHECKING:
    import torch


def emit_comparison(r: dict[str, Any], as_json: bool) -> None:
    """One benchmark figure: value and unit, the reference's figure and the ratio if any, and the
    two model-FLOPs utilisations if measured."""
    if "skipped" in r:
        line = f"{r['name']:<26} vs {r['reference']}: skipped ({r['skipped']})"
    elif "peak_gflops" in r:  # an MFU: a fraction, shown as a percentage with what it divides
        line = (
            f"{r['name']:<26}{r['value']:>12.1%} of the GEMM peak   {r['achieved_gflops']:,.1f} of "
            f"{r['peak_gflops']:,.1f} GFLOP/s"
        )
        if r.get("mfu_of_published_bf16_peak") is not None:
            line += f"; {r['mfu_of_published_bf16_peak']:.1%} of the published bf16 peak"
        if r["value"] > 1:  # seen on a CPU shared with another busy process: its GEMMs suffered more
            line += "   (over 100%: the GEMM did not reach its peak in this run; is the machine busy?)"
    else:
        line = f"{r['name']:<26}{r['value']:>12,.1f} {r['unit']}"
        if "ratio" in r:
            line += f"   {r['reference']}: {r['reference_value']:,.1f}   ratio x{r['ratio']:.2f}"
        elif "skipped_reference" in r:
            line += f"   {r['reference']}: skipped ({r['skipped_reference']})"
        if "mfu" in r:
            line += f"   MFU {r['mfu']:.1%}" + (f" vs {r['reference_mfu']:.1%}" if "reference_mfu" in r else "")
        if "acceptance_rate" in r:
            line += f"   k {r['k']}: {r['acceptance_rate']:.1%} accepted, {r['tokens_per_pass']:.2f} tokens a pass"
    emit(r, as_json, line)


def torch_threads() -> int:
    """The threads torch computes with on the CPU (CTranslate2's intra_threads and ONNX Runtime's
    intra_op_num_threads too, where they run)."""
    import torch

    return torch.get_num_threads()


def header(device: torch.device, what: str) -> None:
    """What a bench measures, and where: a log of figures must say which device they were taken on."""
    from attnlab.bench.device import device_name

    print(f"{what}\ndevice: {device} ({device_name(device)})", file=sys.stderr)


def cmd_bench_train(args: argparse.Namespace, device: torch.device) -> None:
    from attnlab.bench.train import bench_train

    if args.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    if args.shape is not None:
        return cmd_bench_shape(args, device)
    if args.batch is not None or args.seq_len is not None or args.compile:
        raise UsageError("--batch, --seq-len and --compile size a named shape: give --shape too")
    header(
        device,
        f"training step (forward, loss, backward, clip, Adam): d_model 256, 3+3 layers, 4 heads, "
        f"d_ff 1024, vocabulary 8000, dropout 0.1, 64 pairs of 24 + 24 tokens; interleaved, median of "
        f"{args.repeats}",
    )
    for r in bench_train(tuple(args.precision), args.repeats, not args.no_hf, device=device):
        emit_comparison(r, args.json)


def cmd_bench_shape(args: argparse.Namespace, device: torch.device) -> None:
    """`bench train --shape NAME`: a model at a real size against its reference."""
    from attnlab.bench.shapes import CALLS_PER_SAMPLE, SHAPES, bench_shape, check_shape_sizes
    from attnlab.runs.train_config import GRAPHS

    shape = SHAPES.get(args.shape)
    if shape is None:
        raise UsageError(f"--shape {args.shape!r} is not one of {', '.join(SHAPES)}")
    if (refusal := check_shape_sizes(shape, args.batch, args.seq_len)) is not None:
        raise UsageError(refusal)
    if args.compile == GRAPHS and device.type != "cuda":
        raise UsageError(f"--compile graphs replays CUDA graphs: it needs a GPU (the bench is on {device})")
    batch, seq_len = args.batch or shape.batch, args.seq_len or shape.seq_len
    mode = {False: "", True: ", compiled", GRAPHS: ", compiled and replayed as CUDA graphs"}[args.compile]
    calls = CALLS_PER_SAMPLE.get(device.type, 1)
    runs = f" runs of {calls} steps" if calls > 1 else ""
    header(
        device,
        f"training step of {shape.name} (forward, loss, backward, clip, AdamW) against "
        f"{shape.reference_name}: batch {batch} x {seq_len} tokens{mode}; "
        f"interleaved, median of {args.repeats}{runs}",
    )
    for precision in args.precision:
        for r in bench_shape(
            shape, args.batch, args.seq_len, precision, args.compile, args.repeats, not args.no_hf, device=device
        ):
            emit_comparison(r, args.json)


def cmd_bench_decode(args: argparse.Namespace, device: torch.device) -> None:
    from attnlab.bench.decode import bench_decode

    if min(args.repeats, args.batch, args.new_tokens) < 1 or args.new_tokens > 500:
        raise UsageError("--repeats and --batch must be at least 1, --new-tokens between 1 and 500")
    variants = tuple(w for w in args.weights if w != "fp32")
    if "int8" in variants and device.type != "cpu":
        raise UsageError(f"--weights int8 runs on the CPU's kernels; on {device} give bf16")
    header(
        device,
        f"decoding {args.batch} sources of 24 tokens, exactly {args.new_tokens} new tokens each, "
        f"d_model 256, 3+3 layers, vocabulary 8000; interleaved, median of {args.repeats}; "
        f"{torch_threads()} threads",
    )
    for r in bench_decode(
        args.batch,
        args.new_tokens,
        repeats=args.repeats,
        with_hf=not args.no_hf,
        device=device,
        weights=variants,
        with_ct2=not args.no_ct2,
    ):
        emit_comparison(r, args.json)


def cmd_bench_lm(args: argparse.Namespace, device: torch.device) -> None:
    from attnlab.bench.lm import bench_lm, bench_lm_run

    if args.repeats < 1 or args.speculate < 1:
        raise UsageError("--repeats and --speculate must be at least 1")
    if args.run is not None and args.no_ct2:
        raise UsageError("--no-ct2 leaves out the reference of the random-weight sampling; with --run there is none")
    if args.run is None:
        if args.draft or args.weights or args.compiled:
            raise UsageError("--draft, --weights and --compiled measure a trained run: give --run RUN")
        header(
            device,
            f"character LM of configs/shakespeare_char.yaml: training (batch 12 x 64) and sampling with "
            f"the cache; {torch_threads()} threads",
        )
        for r in bench_lm(args.repeats, device=device, with_ct2=not args.no_ct2):
            emit_comparison(r, args.json)
        return
    records = bench_lm_run(
        args.run,
        tuple(args.draft),
        tuple(args.weights),
        args.speculate,
        args.prompt,
        repeats=args.repeats,
        compiled=args.compiled,
        device=device,
    )  # refuses bad input here
    header(
        device,
        f"{args.run}: greedy decoding at batch 1 from --prompt {args.prompt!r}, with the cache; each way "
        f"against plain greedy with the run's own weights; interleaved, median of {args.repeats}",
    )
    for r in records:
        emit_comparison(r, args.json)


def cmd_bench_models(args: argparse.Namespace, device: torch.device) -> None:
    from attnlab.bench.models import MODELS, REFERENCE, bench_models

    if min(args.repeats, args.batch_tokens, args.decode_batch, *args.lengths) < 1:
        raise UsageError("--lengths, --batch-tokens, --decode-batch and --repeats must be at least 1")
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        raise UsageError(f"unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}")
    header(
        device,
        f"train: one optimizer step on {args.batch_tokens} // T pairs of T + T tokens; decode: greedy "
        f"with the cache, {args.decode_batch} sources of T tokens, T new tokens; {args.precision}; median "
        f"of {args.repeats}; vocabulary 8000, random tokens",
    )
    for r in bench_models(
        tuple(args.lengths),
        tuple(args.models),
        args.batch_tokens,
        args.decode_batch,
        args.precision,
        args.repeats,
        device=device,
    ):
        ratio = f"   x{r['ratio']:.2f} vs {REFERENCE}" if "ratio" in r else ""
        emit(
            r,
            args.json,
            f"{r['name']:<7}{r['model']:<19} T={r['seq_len']:<5} batch {r['batch']:<4}"
            f"{r['value']:>10.1f} tokens/s{ratio}",
        )


def cmd_bench_encoder(args: argparse.Namespace, device: torch.device) -> None:
    from attnlab.bench.encoder import bench_encoder

    if min(args.repeats, args.batch, args.seq_len) < 1 or args.seq_len > 512:
        raise UsageError("--repeats and --batch must be at least 1, --seq-len between 1 and 512")
    header(
        device,
        f"encoder forward (no gradients): all-MiniLM-L6-v2's shape (d 384, 6 layers, 12 heads), random "
        f"weights shared with transformers' BertModel, {args.batch} x {args.seq_len} tokens; interleaved, "
        f"median of {args.repeats}; {torch_threads()} threads",
    )
    for r in bench_encoder(
        args.batch,
        args.seq_len,
        tuple(args.precision),
        tuple(args.backends),
        args.repeats,
        device=device,
        with_ort=not args.no_ort,
    ):
        emit_comparison(r, args.json)


def cmd_bench_audio(args: argparse.Namespace, device: torch.device) -> None:
    from attnlab.bench.audio import BATCH, RATE, SECONDS, bench_audio

    if args.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    header(
        device,
        f"audio front ends: recipes/audio/'s digit classifiers, {BATCH} clips of {SECONDS:g} s at {RATE:,} Hz, one "
        f"AdamW step each, features inside the model against precomputed; log-mels at 16 kHz against "
        f"transformers' WhisperFeatureExtractor; interleaved, median of {args.repeats}; {torch_threads()} threads",
    )
    for r in bench_audio(args.repeats, device=device, with_hf=not args.no_hf):
        emit_comparison(r, args.json)


def cmd_bench_gpt2(args: argparse.Namespace, device: torch.device) -> None:
    from attnlab.bench.generate import SHAPES, bench_generate

    if min(args.repeats, args.prompt_len, args.new_tokens, *args.batch) < 1 or args.prompt_len + args.new_tokens > 1024:
        raise UsageError(
            "--repeats, --batch, --prompt-len and --new-tokens must be at least 1, prompt and new "
            "tokens within GPT-2's 1,024 positions"
        )
    shape = SHAPES[args.shape]
    header(
        device,
        f"greedy generation, an imported GPT-2 against transformers' generate on the same random weights "
        f"(GPT-2 {args.shape}: d {shape['n_embd']}, {shape['n_layer']} layers, vocabulary 50,257), prompts "
        f"of {args.prompt_len} tokens, {args.new_tokens} new; fp32; interleaved, median of {args.repeats}",
    )
    for r in bench_generate(
        args.shape, tuple(args.batch), args.prompt_len, args.new_tokens, args.repeats, device=device
    ):
        emit_comparison(r, args.json)


def cmd_bench_attention(args: argparse.Namespace, device: torch.device) -> None:
    from attnlab.bench.attention import PEAK_MEMORY, GiB, backends, bench_attention, plot_attention

    known = backends(args.head_dim)
    unknown = sorted(set(args.backends) - set(known))
    if unknown:
        raise UsageError(f"unknown backend {unknown[0]!r}; choose from {', '.join(known)}")
    if min(args.batch, args.heads, args.head_dim, args.repeats, *args.lengths) < 1:
        raise UsageError("--lengths, --batch, --heads, --head-dim and --repeats must be at least 1")
    if device.type == "cpu" and not Path("/proc/self/clear_refs").exists():
        raise UsageError("bench attention measures the CPU's peak memory through Linux's /proc/self/clear_refs")
    check_new_file(args.plot, args.force, "--plot")
    header(
        device,
        f"attention backends, batch {args.batch}, {args.heads} heads of {args.head_dim}, float32, "
        f"{'causal' if not args.no_causal else 'no mask'}; median of {args.repeats}; peak memory above the "
        f"inputs: {PEAK_MEMORY[device.type]}",
    )
    records = []
    for r in bench_attention(
        tuple(args.lengths),
        tuple(args.backends),
        args.batch,
        args.heads,
        args.head_dim,
        not args.no_causal,
        args.repeats,
        args.memory_budget_gib * GiB,
        args.time_limit,
        device=device,
    ):
        records.append(r)
        what = (
            f"skipped: {r['skipped']}"
            if "skipped" in r
            else f"{r['seconds']:>10.4f} s  {r['peak_bytes'] / 2**20:>10.1f} MiB"
        )
        emit(r, args.json, f"{r['backend']:<8} T={r['seq_len']:<6} {r['pass']:<17} {what}")
    if args.plot:
        plot_attention(records, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)
