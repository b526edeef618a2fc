"""What kind of errors a SCAN model makes: docs/claims/scan_lake_baroni.md's error counts of Lake & Baroni's
overall-best model on the simple split. Reads a split's test file (the published 'IN: ... OUT: ...'
format, as `attnlab data scan` writes it) and the model's greedy outputs, one line each, and counts:

- late / early: the right actions followed by more, or cut short;
- one unit too many or too few: the output is the reference with one repetition of a two-action
  unit (a turn and an action, or two turns) added or left out, anywhere;
- long: errors on commands of 24 actions or more.

    .venv/bin/attnlab data scan --split simple --seed 1234 --out /tmp/scan-simple
    sed -e 's/^IN: //' -e 's/ OUT: .*//' /tmp/scan-simple/tasks_test.txt > /tmp/scan-simple/src.txt
    .venv/bin/attnlab translate runs/lb-overall-simple-5 --checkpoint last --beam 1 \
        --input /tmp/scan-simple/src.txt --output /tmp/scan-simple/hyp5.txt
    .venv/bin/python docs/experiments/scan_errors.py /tmp/scan-simple/tasks_test.txt /tmp/scan-simple/hyp5.txt
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from attnlab.data.corpora import read_lines, read_scan
from attnlab.errors import DataError

LONG = 24  # actions


def one_unit_off(ref: list[str], hyp: list[str]) -> bool:
    """Is one of the two a copy of the other with one repeated two-action unit more?"""
    if abs(len(ref) - len(hyp)) != 2:
        return False
    longer, shorter = (ref, hyp) if len(ref) > len(hyp) else (hyp, ref)
    return any(
        longer[:i] + longer[i + 2 :] == shorter and longer[i : i + 2] in (longer[i + 2 : i + 4], longer[i - 2 : i])
        for i in range(len(longer) - 1)
    )


def error_kinds(pairs: list[tuple[list[str], list[str]]]) -> Counter:
    """Counts of each kind of error over (reference, output) pairs; a pair may count under several."""
    kinds = Counter(commands=len(pairs))
    for ref, hyp in pairs:
        if ref == hyp:
            continue
        kinds["errors"] += 1
        kinds["late"] += len(hyp) > len(ref) and hyp[: len(ref)] == ref
        kinds["early"] += len(hyp) < len(ref) and ref[: len(hyp)] == hyp
        kinds["one unit too many or too few"] += one_unit_off(ref, hyp)
        kinds[f"long (>= {LONG} actions)"] += len(ref) >= LONG
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks", type=Path, help="the split's tasks_test.txt")
    parser.add_argument("outputs", type=Path, help="the model's outputs, one line per command")
    args = parser.parse_args()
    try:
        refs = [actions.split() for _, actions in read_scan(args.tasks)]
        hyps = [line.split() for line in read_lines(args.outputs, allow_empty=True)]
    except DataError as err:
        raise SystemExit(str(err)) from None
    if len(refs) != len(hyps):
        raise SystemExit(f"{args.outputs}: {len(hyps)} lines, {args.tasks} has {len(refs)} commands")
    for kind, n in error_kinds(list(zip(refs, hyps))).items():
        print(f"{kind}: {n:,}")


if __name__ == "__main__":
    main()
