"""`attnlab ask`: a question about images, answered by a visual question answering run."""

from __future__ import annotations

import argparse
import json

from attnlab.cli.common import add_run_dir_args, check_new_file, load_run_for, write_output


def cmd_ask(args: argparse.Namespace) -> None:
    """An answer to --question about each image file: `image TAB answer TAB probability` lines (--json:
    one object per image, with every answer's probability)."""
    from attnlab.tasks.visual_qa import ask
    from attnlab.train.checkpoint import RunDir

    check_new_file(args.output, args.force, "--output")
    model, _, _ = load_run_for(args, {})  # a run of another task (captioning, ...): one line
    run = RunDir(args.run_dir)
    answers = run.read_task_state()["labels"]
    out = []
    for path, p in zip(args.images, ask(model, run, args.images, args.question)):
        best = max(range(len(p)), key=p.__getitem__)
        out.append(json.dumps({"image": path, "question": args.question, "answer": answers[best],
                               "probabilities": dict(zip(answers, p))}) + "\n" if args.json
                   else f"{path}\t{answers[best]}\t{p[best]:.4f}\n")
    write_output(args.output, "".join(out), args.force)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add `ask` to the command line."""
    ask = sub.add_parser("ask", help="answer a question about image files (visual_qa runs): image TAB answer TAB "
                                     "probability per image")
    add_run_dir_args(ask)
    ask.add_argument("images", nargs="+", metavar="IMAGE", help="image files, read as the run's training images")
    ask.add_argument("--question", required=True, help='the question about each image, e.g. "how many circles?"')
    ask.add_argument("--json", action="store_true", help="one JSON object per image, with every answer's probability")
    ask.add_argument("--output", help="output file (default: stdout)")
    ask.add_argument("--force", action="store_true", help="overwrite an existing --output")
    ask.set_defaults(func=cmd_ask)
