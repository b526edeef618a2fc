"""The `attnlab` command: a thin shell over library functions.

User errors (AttnlabError) are printed as one line, ``error: <message>``, with the error class's exit
code; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from attnlab.errors import AttnlabError


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
