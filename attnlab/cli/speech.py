"""`attnlab transcribe`: what a speech recognition run hears in audio files."""

from __future__ import annotations

import argparse

from attnlab.cli.common import (
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


def cmd_transcribe(args: argparse.Namespace) -> None:
    """A transcript for each audio file: `file TAB transcript` lines (with --nbest K, K lines `file TAB
    transcript TAB score` per file), by greedy (--beam 1) or beam search with the KV cache."""
    from attnlab.runs.run_dir import RunDir
    from attnlab.tasks import Transcribes

    search = search_of(args)
    check_new_file(args.output, args.force, "--output")
    task = check_task_serves(args)
    assert isinstance(task, Transcribes)  # a task whose commands include transcribe
    model, _, _ = load_run_for(args, {})
    check_kv_cache(args, model)
    results = task.transcribe(model, RunDir(args.run_dir), args.files, search)
    write_output(args.output, nbest_lines(args.files, results, args.nbest), args.force)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `transcribe` to the command line."""
    transcribe = sub.add_parser(
        "transcribe", help="transcribe audio files (speech_recognition runs): file TAB transcript per file"
    )
    add_run_dir_args(transcribe)
    transcribe.add_argument("files", nargs="*", metavar="AUDIO", help="audio files, read at the run's sample rate")
    add_search_args(transcribe, weights=False)
    add_nbest_output_args(transcribe, "file", "transcript")
    transcribe.set_defaults(func=cmd_transcribe)
