"""`attnlab bench train | decode | lm | encoder | gpt2 | models | attention`: timings as ratios against a
reference, on ``--device`` (auto | cpu | cuda | cuda:N; every suite, every reference on the same one)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from attnlab.cli.common import Parser, add_device_option, check_new_file, device_of, emit
from attnlab.errors import UsageError

if TYPE_CHECKING:
    import torch


def emit_comparison(r: dict, as_json: bool) -> None:
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


def resolved_device(args: argparse.Namespace) -> torch.device:
    """``--device`` on this machine, made the current CUDA device; a device that is not here is
    refused in one line naming --device (a ConfigError: exit code 3)."""
    from attnlab.device import use_device

    return use_device(device_of(args))


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
    from attnlab.runs.config import GRAPHS

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


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `bench and its suites` to the command line."""
    bench = sub.add_parser("bench", help="benchmarks (timings as ratios against a reference in the same run)")
    bench_sub = bench.add_subparsers(dest="suite", required=True, parser_class=Parser)

    def suite(
        name: str, help: str, func: Callable, repeats: int, hf: bool = False, ct2: bool = False, ort: bool = False
    ) -> argparse.ArgumentParser:
        """A benchmark command with the options they all share; ``func(args, device)`` runs it on the
        resolved --device."""
        parser = bench_sub.add_parser(name, help=help)
        parser.add_argument(
            "--repeats",
            type=int,
            default=repeats,
            help=f"timed repetitions of each measurement; the median is reported (default {repeats})",
        )
        parser.add_argument("--json", action="store_true", help="one JSON object per measurement")
        add_device_option(parser)  # every model of the suite, the references too
        if hf:
            parser.add_argument("--no-hf", action="store_true", help="leave out the Hugging Face reference")
        if ct2:
            parser.add_argument("--no-ct2", action="store_true", help="leave out the CTranslate2 reference")
        if ort:
            parser.add_argument("--no-ort", action="store_true", help="leave out the ONNX Runtime reference")
        parser.set_defaults(func=lambda args: func(args, resolved_device(args)))
        return parser

    train = suite("train", "training tokens/s against torch.nn.Transformer and Marian", cmd_bench_train, 10, hf=True)
    train.add_argument(
        "--precision",
        nargs="+",
        choices=["fp32", "bf16"],
        default=["fp32", "bf16"],
        help="precisions to measure (default both)",
    )
    train.add_argument(
        "--shape",
        metavar="NAME",
        help="a model at a real size against its reference: gpt2-small (GPT2LMHeadModel), "
        "transformer-base (torch.nn.Transformer) or bert-base (BertForMaskedLM)",
    )
    train.add_argument("--batch", type=int, help="with --shape: sequences per step (default the shape's)")
    train.add_argument("--seq-len", type=int, help="with --shape: tokens per sequence (default the shape's)")
    train.add_argument(
        "--compile",
        nargs="?",
        const=True,
        default=False,
        choices=["graphs"],
        help="with --shape: both sides through torch.compile (the first steps compile, untimed); "
        "--compile graphs (CUDA): their forward, loss and backward also replayed as CUDA graphs, "
        "as train.compile: graphs runs attnlab's step",
    )
    decode = suite(
        "decode",
        "greedy / beam / uncached decoding against Hugging Face generate and CTranslate2",
        cmd_bench_decode,
        3,
        hf=True,
        ct2=True,
    )
    decode.add_argument("--new-tokens", type=int, default=64, help="tokens generated per sequence (default 64)")
    decode.add_argument("--batch", type=int, default=32, help="sequences decoded together (default 32)")
    decode.add_argument(
        "--weights",
        nargs="+",
        choices=["fp32", "bf16", "int8"],
        default=["fp32", "int8"],
        help="the weights to decode with, each against Hugging Face's fp32 (default fp32 int8; int8 on the CPU only)",
    )
    lm = suite(
        "lm",
        "the character LM: training and sampling tokens/s; with --run, a trained run's greedy "
        "decoding: plain, bf16/int8 weights, speculative",
        cmd_bench_lm,
        10,
        ct2=True,
    )
    lm.add_argument("--run", help="a trained language-model run: time its greedy decoding at batch 1")
    lm.add_argument(
        "--draft",
        action="append",
        default=[],
        metavar="RUN|heads",
        help="with --run: time speculative decoding with this draft (a run with the same tokenizer, or "
        "'heads', the run's own multi-token heads); repeat for several",
    )
    lm.add_argument("--speculate", type=int, default=4, metavar="K", help="tokens a draft proposes a pass (default 4)")
    lm.add_argument(
        "--weights",
        nargs="+",
        choices=["bf16", "int8"],
        default=[],
        help="with --run: time greedy decoding with these weights too",
    )
    lm.add_argument(
        "--compiled",
        action="store_true",
        help="with --run: time greedy decoding with the step compiled too (--kv-cache compiled; the "
        "compilation is not timed)",
    )
    lm.add_argument("--prompt", default="\n", help="with --run: the text to continue (default a newline)")
    encoder = suite(
        "encoder",
        "encoder forward tokens/s against transformers' BertModel and ONNX Runtime, same weights",
        cmd_bench_encoder,
        5,
        ort=True,
    )
    encoder.add_argument("--batch", type=int, default=32, help="sequences per forward (default 32)")
    encoder.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default 128)")
    encoder.add_argument(
        "--precision",
        nargs="+",
        choices=["fp32", "bf16"],
        default=["fp32", "bf16"],
        help="precisions to measure (default both)",
    )
    encoder.add_argument(
        "--backends",
        nargs="+",
        choices=["math", "sdpa"],
        default=["math", "sdpa"],
        help="attnlab's attention backends to measure (default both)",
    )
    gpt2 = suite(
        "gpt2",
        "an imported GPT-2's greedy generate tokens/s against transformers' generate, same weights",
        cmd_bench_gpt2,
        3,
    )
    gpt2.add_argument(
        "--shape",
        choices=["small", "tiny"],
        default="small",
        help="GPT-2 small (d 768, 12 layers) or a tiny one (d 128, 2 layers) (default small)",
    )
    gpt2.add_argument("--batch", type=int, nargs="+", default=[1, 4], help="prompts per call (default 1 4)")
    gpt2.add_argument("--prompt-len", type=int, default=16, help="tokens per prompt (default 16)")
    gpt2.add_argument("--new-tokens", type=int, default=32, help="tokens generated per prompt (default 32)")
    attn = suite("attention", "time and peak memory of each attention backend, by length", cmd_bench_attention, 3)
    attn.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
        help="sequence lengths T to measure (default 256 to 32768, doubling)",
    )
    attn.add_argument(
        "--backends",
        nargs="+",
        default=["math", "sdpa", "chunked", "local", "sparse", "linear"],
        help="attention backends to compare (default all; math is the reference)",
    )
    attn.add_argument("--batch", type=int, default=1, help="sequences per call (default 1)")
    attn.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    attn.add_argument("--head-dim", type=int, default=64, help="size of each head (default 64)")
    attn.add_argument("--no-causal", action="store_true", help="no mask (default: causal)")
    attn.add_argument(
        "--memory-budget-gib", type=float, default=12.0, help="skip a size whose predicted memory exceeds this"
    )
    attn.add_argument("--time-limit", type=float, default=60.0, help="skip a size predicted to take longer (s)")
    attn.add_argument("--plot", help="write time and memory vs T (log-log) to this PNG")
    attn.add_argument("--force", action="store_true", help="overwrite an existing --plot file")
    models = suite("models", "recurrent vs Transformer training and decoding tokens/s, by length", cmd_bench_models, 3)
    models.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[10, 25, 50, 100, 200, 400],
        help="source and target lengths to measure (default 10 to 400)",
    )
    models.add_argument(
        "--models",
        nargs="+",
        default=["transformer", "gru_bahdanau", "gru_fixed_context"],
        help="models to compare (default all three presets' models)",
    )
    models.add_argument("--batch-tokens", type=int, default=4096, help="target tokens per training batch")
    models.add_argument("--decode-batch", type=int, default=16, help="sentences decoded together (default 16)")
    models.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="autocast precision of the training steps (default fp32)",
    )
