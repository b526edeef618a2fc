"""`attnlab bench train | decode | lm | encoder | gpt2 | models | attention | audio`: timings as ratios against a
reference, on ``--device`` (auto | cpu | cuda | cuda:N; every suite, every reference on the same one).
This is its command line, each suite's options; what each suite runs is cli/bench_runners.py."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Callable

from attnlab.cli.bench_runners import (
    cmd_bench_attention,
    cmd_bench_audio,
    cmd_bench_decode,
    cmd_bench_encoder,
    cmd_bench_gpt2,
    cmd_bench_lm,
    cmd_bench_models,
    cmd_bench_train,
)
from attnlab.cli.common import Parser, add_device_option, device_of

if TYPE_CHECKING:
    import torch


def resolved_device(args: argparse.Namespace) -> torch.device:
    """``--device`` on this machine, made the current CUDA device; a device that is not here is
    refused in one line naming --device (a ConfigError: exit code 3)."""
    from attnlab.device import use_device

    return use_device(device_of(args))


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `bench and its suites` to the command line."""
    bench = sub.add_parser("bench", help="benchmarks (timings as ratios against a reference in the same run)")
    bench_sub = bench.add_subparsers(dest="suite", required=True, parser_class=Parser)

    def suite(
        name: str,
        help: str,
        func: Callable[[argparse.Namespace, torch.device], None],
        repeats: int,
        hf: bool = False,
        ct2: bool = False,
        ort: bool = False,
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
    suite(
        "audio",
        "training with the features computed inside the model against precomputed ones, per tokenisation of "
        "sound; log-mels against transformers' WhisperFeatureExtractor",
        cmd_bench_audio,
        10,
        hf=True,
    )
