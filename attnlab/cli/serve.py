"""`attnlab serve`: the web attention explorer over one run, or two side by side."""

from __future__ import annotations

import argparse

from attnlab.cli.common import add_device_option, device_of, stderr_line


def cmd_serve(args: argparse.Namespace) -> None:
    from attnlab.serve.app import create_app, is_loopback, listening_socket, serve
    from attnlab.serve.explorer import Explorer

    device = device_of(args)
    sock = listening_socket(args.host, args.port)  # a port in use is refused before the models load
    with sock:
        explorers = [
            Explorer(run, args.checkpoint, device, args.allow_files)
            for run in (args.run_dir, args.run2)
            if run is not None
        ]
        host, port = sock.getsockname()[:2]
        if not is_loopback(args.host):
            stderr_line(f"note: serving on {args.host}: anyone who can reach this machine can use the explorer")
        print(
            f"attnlab explorer on http://{'[' + host + ']' if ':' in host else host}:{port}/ "
            f"({' | '.join(e.name for e in explorers)}); Ctrl-C stops it",
            flush=True,
        )
        serve(create_app(explorers, host=args.host), sock)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `serve` to the command line."""
    serve = sub.add_parser(
        "serve",
        help="a web page to explore a run's attention: outputs, every head's maps, "
        "heads switched off live; a second run side by side",
    )
    serve.add_argument(
        "run_dir",
        help="a run directory written by `attnlab train` (translation, language model, "
        "classifier, masked LM or image model)",
    )
    serve.add_argument("run2", nargs="?", help="a second run, shown beside the first on the same input")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: a free one)")
    serve.add_argument("--checkpoint", default="best", help="best (default), last, average, or a step number")
    serve.add_argument(
        "--allow-files",
        action="store_true",
        help="let the page name image files for an image model to read (default: no file is read)",
    )
    add_device_option(serve)
    serve.set_defaults(func=cmd_serve)
