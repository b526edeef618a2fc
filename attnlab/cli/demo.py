"""`attnlab demo`: a Transformer learns SCAN from scratch, then decodes the held-out split."""

from __future__ import annotations

import argparse
import json
from typing import Any, cast

from attnlab.cli.common import CONFIGS, add_device_option, device_of
from attnlab.cli.train import new_run_dir


def cmd_demo(args: argparse.Namespace) -> None:
    from attnlab.eval.metrics import exact_match
    from attnlab.files import atomic_write_text
    from attnlab.runs.checkpoint import load_run
    from attnlab.runs.config import RunConfig
    from attnlab.runs.data import read_run_data
    from attnlab.runs.run_dir import RunDir
    from attnlab.tasks.translation import SentencePairs, decode_split
    from attnlab.train.run import train_run

    device = device_of(args)  # before training: a GPU that is not there is refused at once
    cfg = RunConfig.from_file(CONFIGS / "scan.yaml", [f"train.device={args.device}", *(args.set or [])])
    out = new_run_dir(args.out, "demo")
    print("attnlab demo: a Transformer learns SCAN (commands -> actions) from scratch on this machine.")
    summary = train_run(cfg, out)
    # Decode the held-out split with the model as saved, to show the run directory is complete.
    model, _, _ = load_run(out, device=device)
    data = cast("SentencePairs[Any]", read_run_data(RunDir(out)))  # SCAN's: a translation task's sentence pairs
    triples = decode_split(model, data, "test", progress=True)
    em = exact_match([h for _, _, h in triples], [r for _, r, _ in triples])
    for src, ref, hyp in triples[:5]:
        print(f"\n  source:    {src}\n  reference: {ref}\n  output:    {hyp}   [{'ok' if hyp == ref else 'WRONG'}]")
    summary |= {"exact_match": em, "test_examples": len(triples)}
    atomic_write_text(RunDir(out).summary, json.dumps(summary, indent=2))
    print(
        f"\nexact match on {len(triples)} held-out commands: {em:.1%} "
        f"({summary['train_seconds']:.0f} s of training, {summary['n_params']:,} parameters)"
    )
    print(f"run directory: {out}")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `demo` to the command line."""
    demo = sub.add_parser("demo", help="train a small Transformer on the built-in SCAN task and show it working")
    demo.add_argument("--out", help="run directory (default: runs/demo-TIMESTAMP)")
    demo.add_argument(
        "--set",
        action="append",
        metavar="SECTION.FIELD=VALUE",
        help="override a field of configs/scan.yaml, e.g. --set train.max_steps=300 (repeatable)",
    )
    add_device_option(demo)
    demo.set_defaults(func=cmd_demo)
