"""The `attnlab` command: a thin shell over library functions, one module per command group.

Building the parser imports no torch (nor numpy, tokenizers, transformers, matplotlib): each command
imports what it needs when it runs, so `attnlab --version`, `--help` and `data list` start at once.

User errors (AttnlabError) are printed as one line, ``error: <message>``, with the error class's exit
code; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Sequence

from attnlab import __version__
from attnlab.cli import analysis, bench, data, decode, demo, evaluate, images, info, serve, speech, train
from attnlab.cli.common import Parser
from attnlab.errors import RANK_ERRORS, AttnlabError, Interrupted


def make_parser() -> argparse.ArgumentParser:
    """The parser of every ``attnlab`` command, each group adding its own (the command reference is made
    from it)."""
    parser = Parser(prog="attnlab", description="The Transformer family end to end.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in (
        info,
        analysis,
        serve,
        train,
        decode,
        images,
        speech,
        evaluate,
        bench,
        data,
        demo,
    ):  # the order of `attnlab --help`
        group.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names (default: the process's arguments) and return its exit status."""
    code = _run(list(sys.argv[1:] if argv is None else argv))
    # Only a command that imported parallel/distributed.py (train, through joined_world) can have joined a
    # process group; the others, `--version` or `data list` among them, never import it, nor torch.
    distributed = sys.modules.get("attnlab.parallel.distributed")
    if distributed is not None and distributed.under_torchrun():
        distributed.exit_worker(code)  # the interpreter's shutdown can abort a worker whose gloo threads live on
    return code


def _run(argv: list[str]) -> int:
    """The command's exit status: 0, or an AttnlabError's, after its one line on stderr."""
    try:
        args = make_parser().parse_args(argv)
        args.func(args)
    except KeyboardInterrupt:  # Ctrl-C outside training (which raises Interrupted, saying what it saved)
        if "--debug" in argv:
            raise
        print("\ninterrupted", file=sys.stderr)
        return Interrupted.exit_code
    except BrokenPipeError:  # the reader of stdout has gone (`| head -1`): stop quietly, as `yes | head` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not fail again
        return 128 + signal.SIGPIPE
    except AttnlabError as err:
        if "--debug" in argv:
            raise
        if RANK_ERRORS in os.environ:  # a rank of `train --nproc-per-node`: its launcher reports it, once
            Path(os.environ[RANK_ERRORS], f"rank-{os.environ.get('RANK', '0')}").write_text(f"{err.exit_code}\n{err}")
            return err.exit_code
        # Ctrl-C is no error: after the terminal's ^C and any progress bar, what was saved and how to go on
        print(f"\n{err}" if isinstance(err, Interrupted) else f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0
