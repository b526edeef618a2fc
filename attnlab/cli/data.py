"""`attnlab data list | get`: the standard data sets at pinned commits, checksums verified."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli.common import Parser, stderr_line
from attnlab.errors import UsageError


def cmd_data_list(args: argparse.Namespace) -> None:
    from attnlab.data.sources import DATASETS

    for d in DATASETS.values():
        files = f"{len(d.files)} file{'s' if len(d.files) > 1 else ''}"
        print(f"{d.name:<18}{files:<8}{d.size / 1e6:>5.1f} MB   {d.licence}")


def cmd_data_get(args: argparse.Namespace) -> None:
    from attnlab.data.sources import GITHUB_RAW, fetch, lookup

    if args.name is None:
        cmd_data_list(args)
        return
    if args.from_dir and args.base_url:
        raise UsageError("give --from or --base-url, not both")
    dataset = lookup(args.name)
    out = Path(args.out or Path("data") / dataset.name)
    fetch(dataset, out, base_url=args.base_url or GITHUB_RAW, local=args.from_dir, force=args.force,
          log=stderr_line)
    print(f"{out}: {', '.join(f.name for f in dataset.files)}, sha256 verified (source and licence: {out}/README.md)")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add `data list and data get` to the command line."""
    data = sub.add_parser("data", help="the standard data sets: fetch them at pinned commits, checksums verified")
    data_sub = data.add_subparsers(dest="action", required=True, parser_class=Parser)
    data_sub.add_parser("list", help="the data sets `data get` fetches, with sizes and licences").set_defaults(
        func=cmd_data_list)
    data_get = data_sub.add_parser(
        "get", help="download a data set and verify every file's sha256",
        description="Download a data set's files from its GitHub repository at a pinned commit, verify every "
                    "sha256, and write them with a README.md (source, licence, checksums) into --out. Only "
                    "development splits are fetched: this project keeps the test splits out of its own copy "
                    "for independent checks, so their checksums cannot be pinned here.")
    data_get.add_argument("name", nargs="?", help="the data set, as `attnlab data list` names it (none: list them)")
    data_get.add_argument("--out", help="folder to write (default: data/NAME, where the presets in configs/ look)")
    data_get.add_argument("--force", action="store_true",
                          help="write into an existing, non-empty --out, replacing the files of the same names")
    data_get.add_argument("--from", dest="from_dir", metavar="DIR",
                          help="take the files from a local copy (a folder with the same file names) instead of "
                               "downloading; the checksums are verified all the same")
    data_get.add_argument("--base-url", metavar="URL",
                          help="download from a mirror laid out as URL/OWNER/REPO/COMMIT/PATH, in place of "
                               "GitHub's raw-file host (e.g. http://127.0.0.1:8000)")
    data_get.set_defaults(func=cmd_data_get)
