"""The `attnlab` command line (attnlab/cli/main.py), one module per command group."""

from attnlab.cli.main import main, make_parser

__all__ = ["main", "make_parser"]
