"""`attnlab inspect` and `attnlab prune`: what each head does, and which ones matter."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnlab.cli.common import (
    add_device_option,
    add_run_dir_args,
    check_beam,
    check_new_file,
    check_task_serves,
    device_of,
    stderr_line,
)
from attnlab.errors import UsageError


def cmd_inspect(args: argparse.Namespace) -> None:
    from attnlab.analysis.inspect import entropy_over_split
    from attnlab.views import inspect_run

    check_beam(args)
    device = device_of(args)
    check_task_serves(args)
    if (args.src is None) == (args.split is None):
        raise UsageError(
            "give --src (one sentence: figures) or --split (mean entropies over a split of the run's data)"
        )
    if args.split is not None:
        entropies = entropy_over_split(args.run_dir, args.split, args.checkpoint, device)
        for name, values in entropies.items():
            print(f"{name:<34} mean {sum(values) / len(values):.3f}  per head " + " ".join(f"{v:.3f}" for v in values))
        return
    summary = inspect_run(
        args.run_dir, args.src, args.tgt, args.out, args.beam, args.checkpoint, device, args.force, args.question
    )
    for name, entry in summary["modules"].items():
        entropy = " ".join(f"{e:.2f}" for e in entry["entropy"])
        print(f"{name:<34} entropy per head (uniform {entry['uniform_entropy']:.2f}): {entropy}")
    if "target" in summary:
        print(f"target: {summary['target']}")
    if "prediction" in summary:  # a classifier's label, or a single-stream model's answer
        label = summary["prediction"]["label"]
        print(f"prediction: {label} ({summary['prediction']['probabilities'][label]:.4f})")
    print(f"{len(summary['files'])} figures and summary.json in {summary['out']}")


def cmd_prune(args: argparse.Namespace) -> None:
    from attnlab.analysis.prune import prune_run
    from attnlab.analysis.result_plots import pruning_plot

    check_new_file(args.plot, args.force, "--plot")  # now, not after the measurements
    device = device_of(args)
    check_task_serves(args)
    summary = prune_run(
        args.run_dir, args.fraction, args.split, args.out, args.limit, log=stderr_line, device=device, text=args.data
    )
    for r in summary["results"]:
        text = (
            f"  BLEU {r['bleu']:.2f}  exact match {r['exact_match']:.2%}"
            if "bleu" in r
            else f"  accuracy {r['accuracy']:.2%}  macro-F1 {r['macro_f1']:.4f}"
            if "accuracy" in r
            else ""
        )
        print(
            f"{r['heads_pruned']:>3}/{r['heads_total']} heads pruned ({r['fraction']:.0%}): "
            f"{args.split} loss {r['valid_loss']:.4f}{text}"
        )
    if args.plot:
        metric = next(m for m in ("bleu", "accuracy", "valid_loss") if m in summary["results"][0])
        pruning_plot(
            [r["fraction"] for r in summary["results"]],
            [r[metric] for r in summary["results"]],
            metric,
            Path(args.plot),
        )
        print(f"plot: {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    if args.out:
        print(f"pruned model: {args.out}")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `inspect and prune` to the command line."""
    inspect = sub.add_parser("inspect", help="attention heatmaps, alignments and head entropies for one sentence")
    add_run_dir_args(inspect)
    inspect.add_argument(
        "--src",
        help="source sentence (or the text, for a language model; an image file, for an image model or a captioner)",
    )
    inspect.add_argument("--split", help="instead of --src: mean entropy per layer and head over this split")
    inspect.add_argument(
        "--tgt", help="target sentence, or a captioner's caption (default: the model's beam-search output)"
    )
    inspect.add_argument("--question", help="single-stream runs: the question about the --src image")
    inspect.add_argument(
        "--out",
        help="directory for the figures (default: a new folder RUN_DIR/inspect/N-WORDS for "
        "each call, named after its input)",
    )
    inspect.add_argument("--force", action="store_true", help="overwrite figures in an existing --out")
    inspect.add_argument(
        "--beam",
        type=int,
        default=4,
        help="beam size of the search that makes the target when --tgt is not given (default 4)",
    )
    inspect.set_defaults(func=cmd_inspect)

    prune = sub.add_parser("prune", help="rank heads by importance, prune the least important, measure")
    prune.add_argument("run_dir", help="a run directory written by `attnlab train`")
    prune.add_argument(
        "--fraction", type=float, nargs="+", required=True, help="fraction(s) of all heads to prune, e.g. 0.2 0.4 0.6"
    )
    prune.add_argument("--out", help="write the pruned model (one --fraction) as a new run directory")
    prune.add_argument("--split", default="valid", help="the run's data split to rank and measure on")
    prune.add_argument(
        "--data",
        metavar="FILE",
        help="rank and measure on this text file (its train and valid "
        "split) instead of the run's data: a run imported from Hugging "
        "Face has none",
    )
    prune.add_argument("--limit", type=int, help="decode at most this many sentences per measurement")
    prune.add_argument("--plot", help="write the metric against the fraction pruned to this PNG")
    prune.add_argument("--force", action="store_true", help="overwrite an existing --plot file")
    prune.add_argument("--json", action="store_true", help="also print the whole summary as JSON")
    add_device_option(prune)
    prune.set_defaults(func=cmd_prune)
