"""`attnlab evaluate | score | forecast`: a trained run measured on data (BLEU, accuracy, MSE,
perplexity), and a forecaster's forecast against the truth."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from attnlab.cli.common import (
    TRANSLATES,
    add_mask_predict_args,
    add_run_dir_args,
    add_search_args,
    check_kv_cache,
    check_new_file,
    check_task_serves,
    device_of,
    emit,
    load_run_for,
    search_of,
    stderr_line,
    write_output,
)
from attnlab.errors import UsageError

if TYPE_CHECKING:
    from attnlab.nn.decoder_lm import DecoderLM
    from attnlab.nn.memory import TransformerXL
    from attnlab.tasks import EvaluatesFiles
    from attnlab.tasks.forecasting import Forecasting


def cmd_evaluate(args: argparse.Namespace) -> None:
    from attnlab.data.corpora import read_lines
    from attnlab.eval.evaluate import evaluate
    from attnlab.tasks import EvaluatesFiles

    device_of(args)  # refused before any reading
    task = check_task_serves(args)
    if args.test_set is not None:
        _use_test_set(args)
    if isinstance(task, EvaluatesFiles):
        if args.oracle_length:
            raise UsageError(
                f"--oracle-length is for translation runs (--src/--ref or --split); data.task "
                f"'{task.name}' decodes no output sequence to measure"
            )
        _evaluate_own_format(args, task)
        return
    search = search_of(args)
    if args.data is not None:
        raise UsageError(
            f"--data is for tasks that score a file in their own format; data.task '{task.name}' "
            f"reads none: give --src and --ref, or --split"
        )
    model, tokenizers, _ = load_run_for(args, TRANSLATES)
    if search.incremental:
        check_kv_cache(args, model)
    if args.split is not None:
        if args.src or args.ref:
            raise UsageError("give either --split or --src and --ref")
        sources, references = _run_split(args.run_dir, args.split)
    elif args.src and args.ref:
        sources, references = read_lines(args.src, allow_empty=True), read_lines(args.ref, allow_empty=True)
    else:
        raise UsageError("give --src and --ref files, or --split (a split of the run's own data)")
    if len(sources) != len(references):
        raise UsageError(f"{args.src} has {len(sources)} lines but {args.ref} has {len(references)}")
    result = evaluate(model, tokenizers, sources, references, search, progress=True, oracle_length=args.oracle_length)
    result.pop("hypotheses")
    if args.json:
        print(json.dumps(result))
        return
    print(f"BLEU  {result['bleu']:.2f}  {result['bleu_signature']}")
    print(f"chrF  {result['chrf']:.2f}  {result['chrf_signature']}")
    if not search.scores_references:
        print(f"exact match  {result['exact_match']:.2%}")
        print(
            f"({result['sentences']} sentences, mask-predict: {result['iterations']} iterations, length beam "
            f"{result['length_beam']})"
        )
    else:
        print(f"exact match  {result['exact_match']:.2%}   perplexity of the references  {result['ppl']:.3f}")
        how = f"beam {result['beam']}, lenpen {result['lenpen']}" if result["beam"] > 1 else "greedy (beam 1)"
        oracle = ", each output at its reference's length (oracle)" if args.oracle_length else ""
        print(f"({result['sentences']} sentences, {how}{oracle})")


def _use_test_set(args: argparse.Namespace) -> None:
    """``--test-set DATASET:NAME`` as the files `attnlab data get` wrote for it: one file is --data,
    a pair is --src and --ref, chosen by the run's languages (data.pairs.src_lang, tgt_lang)."""
    from attnlab.config import read_config_file
    from attnlab.data.sources import test_set_files
    from attnlab.runs.migration import migrated_data

    if args.src or args.ref or args.data or args.split:
        raise UsageError("give --test-set alone, or --src and --ref, --data or --split")
    files = test_set_files(args.test_set)
    if len(files) == 1:
        args.data = str(files[0])
        return
    data = migrated_data(read_config_file(Path(args.run_dir) / "config.yaml").get("data") or {})
    by_lang = {file.suffix.lstrip("."): file for file in files}
    pairs = data.get("pairs") or {}
    src, tgt = pairs.get("src_lang"), pairs.get("tgt_lang")
    if src not in by_lang or tgt not in by_lang:
        raise UsageError(
            f"--test-set {args.test_set} is in {' and '.join(by_lang)}; {args.run_dir} translates {src} -> {tgt}"
        )
    args.src, args.ref = str(by_lang[src]), str(by_lang[tgt])


def _evaluate_own_format(args: argparse.Namespace, task: EvaluatesFiles) -> None:
    """`evaluate --data FILE` (with --split, a split of that file, where the task's files hold
    splits) or `--split NAME` for a task that reads its own format (classifiers, forecasting): the
    task's report, and with --plot its figure."""
    from attnlab.runs.checkpoint import load_run
    from attnlab.runs.data import read_run_data
    from attnlab.runs.run_dir import RunDir
    from attnlab.tasks import EvaluatesFileSplits, EvaluatesSplits, Searched, Task

    assert isinstance(task, Task)  # a run's task, which cmd_evaluate found EvaluatesFiles
    splits, file_splits = isinstance(task, EvaluatesSplits), isinstance(task, EvaluatesFileSplits)
    both = file_splits and args.data is not None
    if (
        (args.data is None and args.split is None)
        or (args.data and args.split and not both)
        or args.src
        or args.ref
        or (args.split and not splits and not both)
    ):
        raise UsageError(
            f"a run of data.task '{task.name}' is evaluated on a file of its own format: give --data FILE"
            + (
                f" (and --split NAME, a split of that file: {', '.join(cast(EvaluatesFileSplits, task).file_splits)}; "
                f"default {cast(EvaluatesFileSplits, task).file_splits[-1]})"
                if file_splits
                else ""
            )
            + (", or --split NAME (a split of the run's own data)" if splits else "")
        )
    if args.weights is not None:  # their inputs are float32 features, which bf16 weights would not take
        raise UsageError(
            f"--weights is for decoding (translation); a run of data.task '{task.name}' is evaluated "
            f"with the weights it holds"
        )
    check_new_file(args.plot, args.force, "--plot")
    if isinstance(task, Searched):  # decoded as `translate` and `caption` decode
        task = task.searching(search_of(args))
    run = RunDir(args.run_dir)
    model, tokenizers, _ = load_run(args.run_dir, args.checkpoint, device_of(args))
    if isinstance(task, Searched):
        check_kv_cache(args, model)
    if args.data is None and isinstance(task, EvaluatesSplits):
        result = task.evaluate_split(model, read_run_data(run, args.split), args.split)
    else:
        result = task.evaluate_file(model, tokenizers, run.read_task_state(), args.data, args.split)
    if args.plot:
        _plot_record(result, Path(args.plot))
        print(f"plot: {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return
    print("\n".join(task.report(result, args.data or f"split {args.split}")))


def _plot_record(result: dict[str, Any], path: Path) -> None:
    """`evaluate --plot`: a classifier's confusion matrix, or a forecaster's MSE by lead time."""
    from attnlab.analysis.result_plots import confusion_plot, lead_time_plot

    if "confusion" in result:
        confusion_plot(result["confusion"], result["labels"], path)
    else:
        lead_time_plot(result["mse_by_step"], f"{result['file']}, split {result['split']}", path)


def _run_split(run_dir: str, split: str) -> tuple[list[str], list[str]]:
    """Sources and references of a split of the data a run was trained with."""
    from attnlab.runs.data import read_run_data
    from attnlab.runs.run_dir import RunDir

    data = read_run_data(RunDir(run_dir), split)
    return [e.src for e in data.splits[split]], [e.tgt for e in data.splits[split]]


def cmd_score(args: argparse.Namespace) -> None:
    from attnlab.data.batching import collate_pairs, lm_eval_blocks
    from attnlab.data.corpora import read_lines, read_text
    from attnlab.eval.likelihood import evaluate

    model, tokenizers, cfg = load_run_for(args, {})
    if not cfg.capabilities.encoder:  # a language model
        import torch

        if args.src is not None:
            raise UsageError("a language model scores --tgt alone; drop --src")
        assert tokenizers["tgt"] is not None  # a language model's
        stream = torch.tensor(tokenizers["tgt"].encode(read_text(args.tgt)))
        block = cast("DecoderLM | TransformerXL", model).embed.positional.max_positions or 256  # the LM families
        batches = lm_eval_blocks(stream, min(block, max(1, len(stream) - 1)), 32)
    else:
        if args.src is None:
            raise UsageError("a translation model needs --src and --tgt")
        sources, targets = read_lines(args.src), read_lines(args.tgt)
        if len(sources) != len(targets):
            raise UsageError(f"{args.src} has {len(sources)} lines but {args.tgt} has {len(targets)}")
        assert tokenizers["src"] is not None and tokenizers["tgt"] is not None  # a translation model's
        pairs = list(zip(tokenizers["src"].encode_batch(sources), tokenizers["tgt"].encode_batch(targets)))
        batches = [collate_pairs(pairs[i : i + 64]) for i in range(0, len(pairs), 64)]
    result = evaluate(model, batches)
    record = {"nll_per_token": result["loss"], "ppl": result["ppl"], "tokens": result["tokens"]}
    emit(
        record,
        args.json,
        f"perplexity {result['ppl']:.4g}: {result['loss']:.4f} nats per token over "
        f"{result['tokens']:,} tokens ({args.tgt})",
    )


def cmd_forecast(args: argparse.Namespace) -> None:
    """The run's forecast of the ``horizon`` rows from --origin on, in the file's units, as CSV
    (date, then the columns); its MSE and MAE on stderr where the file has the truth."""
    from attnlab.cli.forecast import forecast_from, origin_row
    from attnlab.runs.run_dir import RunDir

    check_new_file(args.output, args.force, "--output")
    check_new_file(args.plot, args.force, "--plot")
    model, _, _ = load_run_for(args, {})
    run = RunDir(args.run_dir)
    task = run.read_config()[1].task  # forecasting's: the one task whose commands name `forecast`
    data = cast("Forecasting", task).evaluate_data(run.read_task_state(), args.data)
    channels = plotted_channels(args.channels, data.series.columns)
    forecast = forecast_from(model, data, origin_row(args.origin, data.series))
    lines = [",".join(["date", *forecast.columns])]
    lines += [",".join([date, *(f"{v:.6g}" for v in row)]) for date, row in zip(forecast.dates, forecast.values)]
    write_output(args.output, "\n".join(lines) + "\n", args.force)
    if forecast.scores is not None:
        stderr_line(
            f"this window (rows {forecast.origin:,}-{forecast.origin + len(forecast.dates) - 1:,}): MSE "
            f"{forecast.scores['mse']:.4f}, MAE {forecast.scores['mae']:.4f} (standardised values)"
        )
    if args.plot:
        from attnlab.analysis.result_plots import forecast_plot

        forecast_plot(forecast, channels, f"{args.run_dir} on {args.data}", Path(args.plot))
        stderr_line(f"plot: {args.plot}")


def plotted_channels(names: str | None, columns: list[str]) -> list[str]:
    """--channels as a list of the run's columns (default: the last, the target of ETT's OT)."""
    chosen = [c.strip() for c in names.split(",") if c.strip()] if names else columns[-1:]
    unknown = [c for c in chosen if c not in columns]
    if unknown or not chosen:
        raise UsageError(f"--channels must name columns of the run ({', '.join(columns)}); got {names!r}")
    return chosen


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `evaluate, forecast and score` to the command line."""
    evaluate = sub.add_parser(
        "evaluate",
        help="score a run on a test set: BLEU, chrF, exact match and perplexity "
        "(translation); accuracy, macro-F1, confusion matrix (classification); "
        "MSE and MAE (forecasting); recall@1/5 and zero-shot accuracy "
        "(contrastive)",
    )
    add_run_dir_args(evaluate)
    add_search_args(evaluate)
    add_mask_predict_args(evaluate)
    evaluate.add_argument("--src", help="source sentences, one per line")
    evaluate.add_argument("--ref", help="reference translations, one per line")
    evaluate.add_argument(
        "--split",
        help="instead of files: a split of the run's own data (valid, test); with --data "
        "of a forecasting run, that file's split (default test)",
    )
    evaluate.add_argument(
        "--oracle-length",
        action="store_true",
        help="decode each output at its reference's length in tokens: end of sentence barred "
        "before it and forced at it (Lake & Baroni 2018's oracle-length evaluation)",
    )
    evaluate.add_argument(
        "--test-set",
        metavar="DATASET:NAME",
        help="a standard test set that `attnlab data get` wrote under data/: "
        "multi30k:test_2016_flickr (also test_2017_flickr, test_2017_mscoco, "
        "test_2018_flickr), sst2:test, ett:ETTh1 or ett:ETTh2 (the test months)",
    )
    evaluate.add_argument(
        "--data",
        help="a classifier's labelled data (text TAB label; an image folder or .npz): "
        "accuracy, macro-F1 and the confusion matrix; a forecasting run's CSV series",
    )
    evaluate.add_argument(
        "--plot",
        help="with --data or --split of a classifier or forecaster: write the confusion "
        "matrix, or the MSE by lead time, to this PNG",
    )
    evaluate.add_argument("--force", action="store_true", help="overwrite an existing --plot")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")
    evaluate.set_defaults(func=cmd_evaluate)

    forecast = sub.add_parser(
        "forecast",
        help="forecast the next rows of a CSV series (forecasting runs): a CSV of "
        "dates and values, and a plot of history, forecast and truth",
    )
    add_run_dir_args(forecast)
    forecast.add_argument("--data", required=True, help="the CSV series, with the run's date column and columns")
    forecast.add_argument(
        "--origin",
        help="the first row to forecast: a row number (0 = the first after the header) "
        "or a date of the date column, in any ISO form that names one row "
        "(2017-10-20 for 2017-10-20 00:00:00; default: after the last row)",
    )
    forecast.add_argument("--output", help="write the forecast CSV here (default: stdout)")
    forecast.add_argument("--plot", help="write a PNG of history, forecast and (where the file has it) truth")
    forecast.add_argument("--channels", help="the columns to plot, comma-separated (default: the last column)")
    forecast.add_argument("--force", action="store_true", help="overwrite an existing --output or --plot")
    forecast.set_defaults(func=cmd_forecast)

    score = sub.add_parser("score", help="teacher-forced perplexity of target text")
    add_run_dir_args(score)
    score.add_argument("--src", help="source sentences (translation models)")
    score.add_argument("--tgt", required=True, help="target sentences, or text for a language model")
    score.add_argument("--json", action="store_true", help="print one JSON object")
    score.set_defaults(func=cmd_score)
