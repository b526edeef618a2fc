"""`attnlab caption | ask`: what a run of images and text says of image files: a caption (captioning
runs), an answer to a question (visual question answering runs)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, cast

from attnlab.cli.common import (
    CAPTIONS,
    add_nbest_output_args,
    add_run_dir_args,
    add_search_args,
    check_kv_cache,
    check_new_file,
    check_task_serves,
    load_run_for,
    nbest_lines,
    search_of,
    write_output,
)

if TYPE_CHECKING:
    from attnlab.models.captioner import CaptionerConfig


def cmd_caption(args: argparse.Namespace) -> None:
    """A caption for each image file: `image TAB caption` lines (with --nbest K, K lines `image TAB
    caption TAB score` per image), by greedy (--beam 1) or beam search with the KV cache."""
    from dataclasses import replace

    from attnlab.runs.run_dir import RunDir
    from attnlab.tasks.captioning import caption_images
    from attnlab.tasks.captions import read_input_images

    search = search_of(args)
    check_new_file(args.output, args.force, "--output")
    check_task_serves(args)
    images = read_input_images(args.images, RunDir(args.run_dir))  # no image, or one that does not decode: one line
    model, tokenizers, cfg = load_run_for(args, CAPTIONS)
    check_kv_cache(args, model)
    if search.max_len is None:
        search = replace(search, max_len=cast("CaptionerConfig", cfg).positions.max_len - 1)  # - 1: BOS; captioner's
    assert tokenizers["tgt"] is not None  # a captioner's
    results = caption_images(model, tokenizers["tgt"], images, search)
    write_output(args.output, nbest_lines(args.images, results, args.nbest), args.force)


def cmd_ask(args: argparse.Namespace) -> None:
    """An answer to --question about each image file: `image TAB answer TAB probability` lines (--json:
    one object per image, with every answer's probability)."""
    from attnlab.runs.run_dir import RunDir
    from attnlab.tasks.visual_qa import ask

    check_new_file(args.output, args.force, "--output")
    model, _, _ = load_run_for(args, {})  # a run of another task (captioning, ...): one line
    run = RunDir(args.run_dir)
    answers = run.read_task_state()["labels"]
    out = []
    for path, p in zip(args.images, ask(model, run, args.images, args.question)):
        best = max(range(len(p)), key=p.__getitem__)
        out.append(
            json.dumps(
                {
                    "image": path,
                    "question": args.question,
                    "answer": answers[best],
                    "probabilities": dict(zip(answers, p)),
                }
            )
            + "\n"
            if args.json
            else f"{path}\t{answers[best]}\t{p[best]:.4f}\n"
        )
    write_output(args.output, "".join(out), args.force)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `caption` and `ask` to the command line."""
    caption = sub.add_parser("caption", help="caption image files (captioning runs): image TAB caption per image")
    add_run_dir_args(caption)
    caption.add_argument("images", nargs="*", metavar="IMAGE", help="image files, read as the run's training images")
    add_search_args(caption, weights=False)
    add_nbest_output_args(caption, "image", "caption")
    caption.set_defaults(func=cmd_caption)

    ask = sub.add_parser(
        "ask", help="answer a question about image files (visual_qa runs): image TAB answer TAB probability per image"
    )
    add_run_dir_args(ask)
    ask.add_argument("images", nargs="+", metavar="IMAGE", help="image files, read as the run's training images")
    ask.add_argument("--question", required=True, help='the question about each image, e.g. "how many circles?"')
    ask.add_argument("--json", action="store_true", help="one JSON object per image, with every answer's probability")
    ask.add_argument("--output", help="output file (default: stdout)")
    ask.add_argument("--force", action="store_true", help="overwrite an existing --output")
    ask.set_defaults(func=cmd_ask)
