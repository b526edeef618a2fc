"""The `attnlab` command: a thin shell over library functions.

User errors (AttnlabError) are printed as one line, ``error: <message>``, with the error class's exit
code; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from attnlab.errors import AttnlabError, UsageError

CONFIGS = Path(__file__).resolve().parent.parent / "configs"  # the presets of a source checkout


def cmd_info(args: argparse.Namespace) -> None:
    import torch

    from attnlab.analysis.budget import format_parameter_report, parameter_report
    from attnlab.config import ModelConfig
    from attnlab.nn.build import build_model

    cfg = ModelConfig.from_file(args.config)
    with torch.device("meta"):  # shapes only: no memory for the weights, no time to initialise them
        model = build_model(cfg)
    report = parameter_report(model)
    if args.json:
        print(json.dumps({"config": str(args.config), "arch": cfg.arch, **report}))
    else:
        print(f"{args.config}: {cfg.arch}, d_model {cfg.d_model}, {cfg.n_heads} heads, "
              f"{cfg.encoder_layers}+{cfg.decoder_layers} layers, d_ff {cfg.d_ff}, vocab {cfg.vocab_size}")
        print(format_parameter_report(report))


def _new_run_dir(out: str | None, stem: str, resume: bool = False) -> Path:
    """The run directory to write: ``out``, or runs/STEM-TIMESTAMP; an existing, non-empty one is
    only taken to resume it, never overwritten."""
    path = Path(out) if out else Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    if resume:
        if not path.is_dir():
            raise UsageError(f"--resume: {path} is not a run directory (give it with --out)")
    elif path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UsageError(f"{path} already exists; pass --resume to continue that run, or choose another --out")
    return path


def cmd_train(args: argparse.Namespace) -> None:
    from attnlab.config import RunConfig
    from attnlab.train.run import train_run

    cfg = RunConfig.from_file(args.config, args.set or [])
    out = _new_run_dir(args.out, Path(args.config).stem, args.resume)
    summary = train_run(cfg, out, resume=args.resume)
    print(json.dumps({k: v for k, v in summary.items() if k != "last_eval"} | summary["last_eval"]))
    print(f"run directory: {out}")


def cmd_demo(args: argparse.Namespace) -> None:
    from attnlab.config import RunConfig
    from attnlab.data.datasets import prepare_data
    from attnlab.eval.metrics import exact_match
    from attnlab.files import atomic_write_text
    from attnlab.train.checkpoint import RunDir, load_run
    from attnlab.train.loop import decode_split
    from attnlab.train.run import train_run

    cfg = RunConfig.from_file(CONFIGS / "scan.yaml", args.set or [])
    out = _new_run_dir(args.out, "demo")
    print("attnlab demo: a Transformer learns SCAN (commands -> actions) from scratch on this machine.")
    summary = train_run(cfg, out)
    # Decode the held-out split with the model as saved, to show the run directory is complete.
    model, tokenizers, _ = load_run(out)
    _, data_cfg, train_cfg = RunDir(out).read_config()
    data = prepare_data(data_cfg, train_cfg.max_tokens, train_cfg.batch_size, train_cfg.seed, tokenizers)
    triples = decode_split(model, data, "test")
    em = exact_match([h for _, _, h in triples], [r for _, r, _ in triples])
    for src, ref, hyp in triples[:5]:
        print(f"\n  source:    {src}\n  reference: {ref}\n  output:    {hyp}   [{'ok' if hyp == ref else 'WRONG'}]")
    summary |= {"exact_match": em, "test_examples": len(triples)}
    atomic_write_text(RunDir(out).summary, json.dumps(summary, indent=2))
    print(f"\nexact match on {len(triples)} held-out commands: {em:.1%} "
          f"({summary['train_seconds']:.0f} s of training, {summary['n_params']:,} parameters)")
    print(f"run directory: {out}")


def cmd_average(args: argparse.Namespace) -> None:
    from attnlab.train.checkpoint import write_average

    path, steps = write_average(args.run_dir, args.last)
    print(f"averaged steps {', '.join(map(str, steps))} into {path}")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors through the one error path (exit code 2, one line)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        from attnlab.errors import UsageError

        raise UsageError(f"{self.prog}: {message}")


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnlab", description="The Transformer family end to end.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    info = sub.add_parser("info", help="parameter counts of a model config")
    info.add_argument("config", help="YAML or JSON config file with a 'model' section")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=cmd_info)

    train = sub.add_parser("train", help="train a model from a config file")
    train.add_argument("config", help="YAML or JSON config with model, data and train sections")
    train.add_argument("--out", help="run directory (default: runs/CONFIG-TIMESTAMP)")
    train.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                       help="override one config field, e.g. --set train.max_steps=200 (repeatable)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint")
    train.set_defaults(func=cmd_train)

    average = sub.add_parser("average", help="average the newest checkpoints of a run (as the paper does)")
    average.add_argument("run_dir", help="a run directory written by `attnlab train`")
    average.add_argument("--last", type=int, default=5, help="how many of the newest checkpoints (default 5)")
    average.set_defaults(func=cmd_average)

    demo = sub.add_parser("demo", help="train a small Transformer on the built-in SCAN task and show it working")
    demo.add_argument("--out", help="run directory (default: runs/demo-TIMESTAMP)")
    demo.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                      help="override a field of configs/scan.yaml, e.g. --set train.max_seconds=60 (repeatable)")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = make_parser().parse_args(argv)
        args.func(args)
    except AttnlabError as err:
        if debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
