"""`attnlab data list | get | scan`: the standard data sets at pinned commits, checksums verified; SCAN's
splits derived from their rules."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli.common import Parser, stderr_line
from attnlab.errors import UsageError


def cmd_data_list(args: argparse.Namespace) -> None:
    from attnlab.data.sources import DATASETS

    for d in DATASETS.values():
        files = f"{len(d.files)} file{'s' if len(d.files) > 1 else ''}"
        size = f"{d.size / 1e6:>5.1f} MB" if d.size is not None else "    ? MB"  # pinned by checksums alone
        print(f"{d.name:<18}{files:<11}{size}   {d.licence}")


def cmd_data_get(args: argparse.Namespace) -> None:
    from attnlab.data.fetch import fetch
    from attnlab.data.pinned import GITHUB_RAW
    from attnlab.data.sources import listing, lookup

    if args.name is None:
        cmd_data_list(args)
        return
    if args.from_dir and args.base_url:
        raise UsageError("give --from or --base-url, not both")
    dataset = lookup(args.name)
    out = Path(args.out or Path("data") / dataset.name)
    written = fetch(
        dataset,
        out,
        base_url=args.base_url or GITHUB_RAW,
        local=args.from_dir,
        force=args.force,
        dev_only=args.dev_only,
        log=stderr_line,
    )
    left = [f.name for f in dataset.files if f not in written]
    print(
        f"{out}: {listing([f.name for f in written])}, sha256 verified (source and licence: {out}/README.md)"
        + (f"; not written: {listing(left)}" if left else "")
    )


def cmd_data_scan(args: argparse.Namespace) -> None:
    """One SCAN split, derived from its rule, as tasks_train.txt and tasks_test.txt in --out."""
    from attnlab.config import one_of
    from attnlab.data.scan import SCAN_SPLITS, scan_lines, scan_split
    from attnlab.errors import ConfigError
    from attnlab.files import atomic_write_text

    try:
        one_of("--split", args.split, SCAN_SPLITS)
    except ConfigError as err:
        raise UsageError(str(err)) from None
    out = Path(args.out)
    files = {name: out / f"tasks_{name}.txt" for name in ("train", "test")}
    existing = [str(path) for path in files.values() if path.exists()]
    if existing and not args.force:
        raise UsageError(f"{existing[0]} already exists; pass --force to replace it, or choose another --out")
    train, test = scan_split(args.split, args.seed)
    out.mkdir(parents=True, exist_ok=True)
    for name, pairs in (("train", train), ("test", test)):
        atomic_write_text(files[name], scan_lines(pairs))
    print(f"{out}: tasks_train.txt ({len(train):,} pairs), tasks_test.txt ({len(test):,} pairs), split {args.split}")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `data list, data get and data scan` to the command line."""
    data = sub.add_parser("data", help="the standard data sets: fetch them at pinned commits, checksums verified")
    data_sub = data.add_subparsers(dest="action", required=True, parser_class=Parser)
    data_sub.add_parser("list", help="the data sets `data get` fetches, with sizes and licences").set_defaults(
        func=cmd_data_list
    )
    data_get = data_sub.add_parser(
        "get",
        help="download a data set and verify every file's sha256",
        description="Download a data set's files from its GitHub repository at a pinned commit, verify every "
        "sha256, and write them with a README.md (source, licence, checksums) into --out: the "
        "training and validation files and the standard test sets (--dev-only: not the test sets).",
    )
    data_get.add_argument("name", nargs="?", help="the data set, as `attnlab data list` names it (none: list them)")
    data_get.add_argument("--out", help="folder to write (default: data/NAME, where the presets in configs/ look)")
    data_get.add_argument(
        "--force",
        action="store_true",
        help="write into an existing, non-empty --out, replacing the files of the same names",
    )
    data_get.add_argument(
        "--from",
        dest="from_dir",
        metavar="DIR",
        help="take the files from a local copy instead of downloading: a folder with the same file names "
        "(a Multi30k test file as the repository's .gz), or a clone of the upstream "
        "repository, from which the derived files are made; the checksums are verified all "
        "the same, and test files the copy lacks are named and left out",
    )
    data_get.add_argument(
        "--dev-only", action="store_true", help="only the training and validation files, not the test sets"
    )
    data_get.add_argument(
        "--base-url",
        metavar="URL",
        help="download from a mirror laid out as URL/OWNER/REPO/COMMIT/PATH, in place of "
        "GitHub's raw-file host (e.g. http://127.0.0.1:8000)",
    )
    data_get.set_defaults(func=cmd_data_get)
    data_scan = data_sub.add_parser(
        "scan",
        help="write a SCAN split (simple, length, add-primitive, templates), derived from its rule",
        description="Write the training and test commands of a split of SCAN, derived from the grammar and the "
        "split's rule (attnlab/data/scan.py), as tasks_train.txt and tasks_test.txt in the published "
        "'IN: ... OUT: ...' format.",
    )
    data_scan.add_argument(
        "--split",
        required=True,
        help="simple, length, add_prim_jump, add_prim_turn_left, "
        "template_jump_around_right, template_around_right, "
        "template_opposite_right or template_right",
    )
    data_scan.add_argument("--out", required=True, help="the folder to write")
    data_scan.add_argument("--seed", type=int, default=0, help="the random draw of the simple split (default 0)")
    data_scan.add_argument("--force", action="store_true", help="replace existing tasks_train.txt / tasks_test.txt")
    data_scan.set_defaults(func=cmd_data_scan)
