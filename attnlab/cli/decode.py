"""`attnlab translate | generate | predict | fill-mask | evaluate | forecast | score`: using a trained run."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from pathlib import Path

from attnlab.cli.common import (
    GENERATES,
    MAX_BATCH,
    MAX_NEW_TOKENS,
    TRANSLATES,
    add_device_option,
    check_beam,
    check_kv_cache,
    check_new_file,
    check_task_serves,
    device_of,
    emit,
    stderr_line,
    load_run_for,
    write_output,
)
from attnlab.errors import UsageError


def cmd_translate(args: argparse.Namespace) -> None:
    from attnlab.data.corpora import read_input_lines
    from attnlab.data.tokenizers import UNK
    from attnlab.decode.translate import translate

    from attnlab.decode.speculative import SpeculationStats

    check_beam(args)
    if args.draft is not None and (args.beam != 1 or args.nbest != 1 or args.min_len or args.speculate < 1):
        raise UsageError("--draft decodes greedily: give --beam 1, no --nbest or --min-len, and --speculate >= 1")
    check_new_file(args.output, args.force, "--output")  # now, not after the decoding
    model, tokenizers, cfg = load_run_for(args, TRANSLATES)
    check_kv_cache(args, model)
    draft = _load_draft(args, model, tokenizers, TRANSLATES) if args.draft is not None else None
    lines = read_input_lines(args.input)
    speculation = SpeculationStats()
    results = translate(model, tokenizers, lines, args.beam, args.lenpen, args.nbest, not args.no_cache,
                        args.batch_size, args.max_len, args.min_len, cfg.max_len - 1, args.truncate,  # -1: EOS
                        progress=True, kv_cache=args.kv_cache, draft=draft, speculate=args.speculate,
                        speculation=speculation)
    if draft is not None:
        print(_speculation_line(args.speculate, speculation), file=sys.stderr)
    unknown = [ids.count(UNK) for ids in tokenizers["src"].encode_batch(lines)]
    if sum(unknown):
        print(f"note: {sum(unknown)} unknown source tokens in {sum(n > 0 for n in unknown)} lines were read as "
              f"<unk>", file=sys.stderr)
    if args.nbest == 1:
        text = "".join(hyps[0][0] + "\n" for hyps in results)
    else:  # n-best lines: sentence index ||| hypothesis ||| score
        text = "".join(f"{i} ||| {hyp} ||| {score:.4f}\n" for i, hyps in enumerate(results) for hyp, score in hyps)
    write_output(args.output, text, args.force)


def cmd_generate(args: argparse.Namespace) -> None:
    import torch

    from attnlab.decode.search import sample

    if args.temperature <= 0:
        raise UsageError(f"--temperature must be > 0 (got {args.temperature}); use --top-k 1 for greedy")
    if args.top_k is not None and args.top_k < 1:
        raise UsageError(f"--top-k must be at least 1 (got {args.top_k})")
    if args.speculate < 1:
        raise UsageError(f"--speculate must be at least 1 (got {args.speculate})")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1] (got {args.top_p})")
    if not 0 <= args.max_new_tokens <= MAX_NEW_TOKENS or not 1 <= args.num_samples <= MAX_BATCH:
        raise UsageError(f"--max-new-tokens must be between 0 and {MAX_NEW_TOKENS:,} and --num-samples between 1 "
                         f"and {MAX_BATCH}")
    model, tokenizers, _ = load_run_for(args, GENERATES)
    check_kv_cache(args, model)
    tok = tokenizers["tgt"]
    prompt_ids = tok.encode(args.prompt)
    if not prompt_ids:
        raise UsageError("--prompt is empty after tokenisation; give at least one known token")
    positions = model.embed.positional.max_positions
    if positions is not None and len(prompt_ids) > positions:
        print(f"note: --prompt has {len(prompt_ids)} tokens; the model sees the last {positions} "
              f"(its max_len)", file=sys.stderr)
    prompt = torch.tensor([prompt_ids] * args.num_samples, device=next(model.parameters()).device)
    seed = args.seed
    if seed is None:
        seed = secrets.randbelow(2 ** 31)
        print(f"seed {seed} (--seed {seed} gives this text again)", file=sys.stderr)
    generator = torch.Generator().manual_seed(seed)
    if args.draft is not None:
        rows = _speculative_rows(args, model, tokenizers, prompt, generator)
    else:
        rows = sample(model, prompt=prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                      top_k=args.top_k, top_p=args.top_p, generator=generator, stop_at_eos=False,
                      kv_cache=args.kv_cache)
    for i, row in enumerate(rows):
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        print(args.prompt + tok.decode(row))


def _load_draft(args: argparse.Namespace, model, tokenizers, needs: dict[str, bool]):
    """``--draft``'s model, on the model's device: a run of the same kind whose tokenizers are the
    model's (a draft's token ids must mean the same tokens)."""
    from attnlab.train.checkpoint import load_run

    draft, draft_tokenizers, draft_cfg = load_run(args.draft, "best", next(model.parameters()).device)
    if any(getattr(draft_cfg.capabilities, name) != value for name, value in needs.items()):
        raise UsageError(f"--draft {args.draft} holds a model of arch '{draft_cfg.arch}', which cannot draft for "
                         f"`attnlab {args.command}`")
    for role, tok in tokenizers.items():
        other = draft_tokenizers.get(role)
        if tok is not None and (other is None or other.vocab_size != tok.vocab_size
                                or other.id_tokens(range(tok.vocab_size)) != tok.id_tokens(range(tok.vocab_size))):
            raise UsageError(f"--draft {args.draft} has another {role} vocabulary than {args.run_dir}; a draft must "
                             f"share the model's tokenizers")
    return draft


def _speculation_line(k: int, stats) -> str:
    return (f"speculative decoding, k {k}: {stats.accepted} of {stats.proposed} draft tokens accepted "
            f"({stats.acceptance_rate:.1%}), {stats.tokens_per_pass:.2f} tokens per pass of the target")


def _speculative_rows(args: argparse.Namespace, model, tokenizers, prompt, generator) -> list[list[int]]:
    """``generate --draft``: each sample drawn by speculative decoding with the draft run; what
    speculation did goes to stderr."""
    from attnlab.decode.speculative import Sampler, SpeculationStats, speculative_decode

    draft = _load_draft(args, model, tokenizers, GENERATES)
    limits = [p for p in (m.embed.positional.max_positions for m in (model, draft)) if p is not None]
    if limits and prompt.shape[1] + args.max_new_tokens > min(limits):
        raise UsageError(f"--draft: speculative decoding stops at the models' positions ({min(limits)}); with this "
                         f"prompt ask for at most {max(0, min(limits) - prompt.shape[1])} new tokens")
    sampler = Sampler(args.temperature, args.top_k, args.top_p, generator)
    rows, total = [], SpeculationStats()
    for row in prompt:
        tokens, stats = speculative_decode(model, draft, prompt=row[None], k=args.speculate,
                                           max_new_tokens=args.max_new_tokens, sampler=sampler, stop_at_eos=False)
        rows.append(tokens)
        total.add(stats)
    print(_speculation_line(args.speculate, total), file=sys.stderr)
    return rows


def cmd_evaluate(args: argparse.Namespace) -> None:
    from attnlab.data.corpora import read_lines
    from attnlab.eval.evaluate import evaluate

    check_beam(args)
    device_of(args)  # refused before any reading
    task = check_task_serves(args)
    if task.evaluate_file is not None:
        _evaluate_own_format(args, task)
        return
    if args.data is not None:
        raise UsageError(f"--data is for tasks that score a file in their own format; data.task '{task.name}' "
                         f"takes --src and --ref, or --split")
    model, tokenizers, _ = load_run_for(args, TRANSLATES)
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
    result = evaluate(model, tokenizers, sources, references, args.beam, args.lenpen, not args.no_cache, progress=True,
                      kv_cache=args.kv_cache)
    result.pop("hypotheses")
    if args.json:
        print(json.dumps(result))
    else:
        print(f"BLEU  {result['bleu']:.2f}  {result['bleu_signature']}")
        print(f"chrF  {result['chrf']:.2f}  {result['chrf_signature']}")
        print(f"exact match  {result['exact_match']:.2%}   perplexity of the references  {result['ppl']:.3f}")
        print(f"({result['sentences']} sentences, beam {result['beam']}, lenpen {result['lenpen']})")


def _evaluate_own_format(args: argparse.Namespace, task) -> None:
    """`evaluate --data FILE` or `--split NAME` (both, where the task's files hold splits) for a
    task that reads its own format (classifiers, forecasting): the task's report, and with --plot
    its figure."""
    from attnlab.train.checkpoint import RunDir, load_run
    from attnlab.train.run import read_run_data

    splits = task.evaluate_split is not None
    both = task.file_splits and args.data is not None
    if (args.data is None and args.split is None) or (args.data and args.split and not both) or args.src or args.ref \
            or (args.split and not splits):
        raise UsageError(f"a run of data.task '{task.name}' is evaluated on a file of its own format: give --data FILE"
                         + (" (and --split NAME, a split of that file; default test)" if task.file_splits else "")
                         + (", or --split NAME (a split of the run's own data)" if splits else ""))
    check_new_file(args.plot, args.force, "--plot")
    run = RunDir(args.run_dir)
    model, tokenizers, _ = load_run(args.run_dir, args.checkpoint, device_of(args))
    if args.data is None:
        result = task.evaluate_split(model, read_run_data(run, args.split), args.split)
    elif task.file_splits:
        result = task.evaluate_file(model, run.read_config()[1], tokenizers, run.read_task_state(), args.data,
                                    args.split)
    else:
        result = task.evaluate_file(model, run.read_config()[1], tokenizers, run.read_task_state(), args.data)
    if args.plot:
        _plot_record(result, Path(args.plot))
        print(f"plot: {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return
    print("\n".join(task.report(result, args.data or f"split {args.split}")))


def _plot_record(result: dict, path: Path) -> None:
    """`evaluate --plot`: a classifier's confusion matrix, or a forecaster's MSE by lead time."""
    from attnlab.analysis.plots import confusion_plot, lead_time_plot

    if "confusion" in result:
        confusion_plot(result["confusion"], result["labels"], path)
    else:
        lead_time_plot(result["mse_by_step"], f"{result['file']}, split {result['split']}", path)


def _run_split(run_dir: str, split: str) -> tuple[list[str], list[str]]:
    """Sources and references of a split of the data a run was trained with."""
    from attnlab.train.checkpoint import RunDir
    from attnlab.train.run import read_run_data

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
        stream = torch.tensor(tokenizers["tgt"].encode(read_text(args.tgt)))
        block = model.embed.positional.max_positions or 256
        batches = lm_eval_blocks(stream, min(block, max(1, len(stream) - 1)), 32)
    else:
        if args.src is None:
            raise UsageError("a translation model needs --src and --tgt")
        sources, targets = read_lines(args.src), read_lines(args.tgt)
        if len(sources) != len(targets):
            raise UsageError(f"{args.src} has {len(sources)} lines but {args.tgt} has {len(targets)}")
        pairs = list(zip(tokenizers["src"].encode_batch(sources), tokenizers["tgt"].encode_batch(targets)))
        batches = [collate_pairs(pairs[i:i + 64]) for i in range(0, len(pairs), 64)]
    result = evaluate(model, batches)
    record = {"nll_per_token": result["loss"], "ppl": result["ppl"], "tokens": result["tokens"]}
    emit(record, args.json, f"perplexity {result['ppl']:.4g}: {result['loss']:.4f} nats per token over "
                             f"{result['tokens']:,} tokens ({args.tgt})")


def cmd_predict(args: argparse.Namespace) -> None:
    """The run's task reads the inputs (lines of text, image files) and gives each one's class
    probabilities; one line per input: [its name TAB] the best label TAB its probability."""
    from attnlab.train.checkpoint import RunDir

    if not 1 <= args.batch_size <= MAX_BATCH:
        raise UsageError(f"--batch-size must be between 1 and {MAX_BATCH} (got {args.batch_size})")
    check_new_file(args.output, args.force, "--output")
    model, _, _ = load_run_for(args, {})
    run = RunDir(args.run_dir)
    labels = run.read_task_state()["labels"]
    out = []
    for name, p in run.read_config()[1].task.predict(model, run, args.inputs, args.input, args.batch_size):
        if p is None:  # a blank line gives a blank line
            out.append("\n")
            continue
        best = max(range(len(p)), key=p.__getitem__)
        named = {"input": name} if name is not None else {}
        out.append(json.dumps(named | {"label": labels[best], "probabilities": dict(zip(labels, p))}) + "\n"
                   if args.json else "".join(f"{field}\t" for field in named.values()) + f"{labels[best]}\t{p[best]:.4f}\n")
    write_output(args.output, "".join(out), args.force)


def cmd_forecast(args: argparse.Namespace) -> None:
    """The run's forecast of the ``horizon`` rows from --origin on, in the file's units, as CSV
    (date, then the columns); its MSE and MAE on stderr where the file has the truth."""
    from attnlab.tasks.forecasting import Forecasting, forecast_from, origin_row
    from attnlab.train.checkpoint import RunDir

    check_new_file(args.output, args.force, "--output")
    check_new_file(args.plot, args.force, "--plot")
    model, _, _ = load_run_for(args, {})
    run = RunDir(args.run_dir)
    data = Forecasting.evaluate_data(run.read_config()[1], run.read_task_state(), args.data)
    channels = plotted_channels(args.channels, data.series.columns)
    forecast = forecast_from(model, data, origin_row(args.origin, data.series))
    lines = [",".join(["date", *forecast.columns])]
    lines += [",".join([date, *(f"{v:.6g}" for v in row)]) for date, row in zip(forecast.dates, forecast.values)]
    write_output(args.output, "\n".join(lines) + "\n", args.force)
    if forecast.scores is not None:
        stderr_line(f"this window (rows {forecast.origin:,}-{forecast.origin + len(forecast.dates) - 1:,}): MSE "
                    f"{forecast.scores['mse']:.4f}, MAE {forecast.scores['mae']:.4f} (standardised values)")
    if args.plot:
        from attnlab.analysis.plots import forecast_plot

        forecast_plot(forecast, channels, f"{args.run_dir} on {args.data}", Path(args.plot))
        stderr_line(f"plot: {args.plot}")


def plotted_channels(names: str | None, columns: list[str]) -> list[str]:
    """--channels as a list of the run's columns (default: the last, the target of ETT's OT)."""
    chosen = [c.strip() for c in names.split(",") if c.strip()] if names else columns[-1:]
    unknown = [c for c in chosen if c not in columns]
    if unknown or not chosen:
        raise UsageError(f"--channels must name columns of the run ({', '.join(columns)}); got {names!r}")
    return chosen


def cmd_fill_mask(args: argparse.Namespace) -> None:
    from attnlab.tasks.masked_lm import fill_mask
    from attnlab.train.checkpoint import RunDir
    from attnlab.train.init import untrained_of

    if not 1 <= args.top_k <= 1000:
        raise UsageError(f"--top-k must be between 1 and 1000 (got {args.top_k})")
    model, tokenizers, _ = load_run_for(args, {})
    if any(name.startswith("mlm_head.") for name in untrained_of(RunDir(args.run_dir), model)):
        raise UsageError(f"{args.run_dir}: its masked-LM head was never trained (imported without one, as a "
                         f"Hugging Face BertModel is); fill-mask needs a run trained or imported with it")
    fillers = fill_mask(model, tokenizers["src"], args.text, args.top_k)
    if args.json:
        print(json.dumps([[{"token": token, "probability": p} for token, p in row] for row in fillers]))
        return
    for n, row in enumerate(fillers, start=1):
        print(f"[MASK] {n}: " + ", ".join(f"{token} ({p:.3f})" for token, p in row))


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add `translate, generate, predict, fill-mask, evaluate, forecast and score` to the command line."""
    def run_dir_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("run_dir", help="a run directory written by `attnlab train`")
        p.add_argument("--checkpoint", default="best", help="best (default), last, average, or a step number")
        add_device_option(p)

    def kv_cache_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--kv-cache", default="auto", metavar="auto|dynamic|static|graph",
                       help="the cache of keys and values: auto (graph on a GPU where the model allows, else dynamic), "
                            "dynamic, static (preallocated) or graph (static, the step replayed as a CUDA graph); "
                            "the same output each way")

    def weights_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--weights", default="fp32", choices=("fp32", "bf16", "int8"),
                       help="decode with the weights as trained (fp32), in bfloat16, or with int8 linear layers "
                            "(dynamic per-channel quantisation, CPU only)")

    def draft_options(p: argparse.ArgumentParser, keeps: str) -> None:
        p.add_argument("--draft", metavar="RUN",
                       help=f"speculative decoding: a smaller run with the same tokenizers proposes tokens that this "
                            f"model checks in one pass; {keeps}")
        p.add_argument("--speculate", type=int, default=4, metavar="K",
                       help="with --draft: tokens the draft proposes per pass of the model (default 4)")

    def search_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--beam", type=int, default=4, help="beam size; 1 = greedy (default 4, as the paper)")
        p.add_argument("--lenpen", type=float, default=0.6, help="GNMT length penalty alpha (default 0.6)")
        p.add_argument("--no-cache", action="store_true", help="recompute every prefix (same output, slower)")
        kv_cache_option(p)
        weights_option(p)

    translate = sub.add_parser("translate", help="translate lines of text (stdin to stdout by default)")
    run_dir_args(translate)
    search_args(translate)
    draft_options(translate, "greedy (--beam 1), and the same output as greedy decoding")
    translate.add_argument("--nbest", type=int, default=1, help="print the K best per sentence: index ||| hypothesis ||| score")
    translate.add_argument("--input", help="source file, one sentence per line (default: stdin)")
    translate.add_argument("--output", help="output file (default: stdout)")
    translate.add_argument("--force", action="store_true", help="overwrite an existing --output")
    translate.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default 64)")
    translate.add_argument("--max-len", type=int, help="most output tokens (default: source length + 50)")
    translate.add_argument("--min-len", type=int, default=0, help="fewest output tokens before EOS (default 0)")
    translate.add_argument("--truncate", action="store_true",
                           help="cut source lines longer than the model's max_len (default: refuse them)")
    translate.set_defaults(func=cmd_translate)

    generate = sub.add_parser("generate", help="sample text from a language model")
    run_dir_args(generate)
    generate.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    generate.add_argument("--max-new-tokens", type=int, default=200, help="tokens to sample after the prompt "
                                                                         "(default 200)")
    generate.add_argument("--temperature", type=float, default=1.0,
                          help="divide the logits by T before sampling: below 1 is surer, above 1 more varied "
                               "(default 1)")
    generate.add_argument("--top-k", type=int, help="sample among the K most likely tokens")
    generate.add_argument("--top-p", type=float, help="sample from the smallest set of probability >= P")
    generate.add_argument("--seed", type=int,
                          help="random seed: the same seed gives the same text (default: a new one each time, "
                               "printed on stderr)")
    generate.add_argument("--num-samples", type=int, default=1, help="independent samples of the prompt (default 1)")
    draft_options(generate, "the text keeps this model's distribution (with --top-k 1, exactly its greedy text)")
    kv_cache_option(generate)
    weights_option(generate)
    generate.set_defaults(func=cmd_generate)

    predict = sub.add_parser("predict", help="classify lines of text or image files: one label and its probability "
                                             "per input")
    run_dir_args(predict)
    predict.add_argument("inputs", nargs="*", metavar="IMAGE", help="image files (a run of image_classification)")
    predict.add_argument("--input", help="text classifiers: one text per line, or text_a TAB text_b (default: stdin)")
    predict.add_argument("--output", help="output file (default: stdout)")
    predict.add_argument("--force", action="store_true", help="overwrite an existing --output")
    predict.add_argument("--json", action="store_true", help="one JSON object per line, with every class's probability")
    predict.add_argument("--batch-size", type=int, default=64, help="inputs per batch (default 64)")
    predict.set_defaults(func=cmd_predict)

    fill = sub.add_parser("fill-mask", help="the most likely words for each [MASK] of a text (masked-LM runs)")
    run_dir_args(fill)
    fill.add_argument("text", help='a text with one or more [MASK], e.g. "the film was [MASK] ."')
    fill.add_argument("--top-k", type=int, default=5, help="fillers per [MASK] (default 5)")
    fill.add_argument("--json", action="store_true", help="print one JSON list: per [MASK], tokens and probabilities")
    fill.set_defaults(func=cmd_fill_mask)

    evaluate = sub.add_parser("evaluate", help="score a run on a test set: BLEU, chrF, exact match and perplexity "
                                               "(translation); accuracy, macro-F1, confusion matrix (classification); "
                                               "MSE and MAE (forecasting)")
    run_dir_args(evaluate)
    search_args(evaluate)
    evaluate.add_argument("--src", help="source sentences, one per line")
    evaluate.add_argument("--ref", help="reference translations, one per line")
    evaluate.add_argument("--split", help="instead of files: a split of the run's own data (valid, test); with --data "
                                          "of a forecasting run, that file's split (default test)")
    evaluate.add_argument("--data", help="a classifier's labelled data (text TAB label; an image folder or .npz): "
                                         "accuracy, macro-F1 and the confusion matrix; a forecasting run's CSV series")
    evaluate.add_argument("--plot", help="with --data or --split of a classifier or forecaster: write the confusion "
                                         "matrix, or the MSE by lead time, to this PNG")
    evaluate.add_argument("--force", action="store_true", help="overwrite an existing --plot")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")
    evaluate.set_defaults(func=cmd_evaluate)

    forecast = sub.add_parser("forecast", help="forecast the next rows of a CSV series (forecasting runs): a CSV of "
                                               "dates and values, and a plot of history, forecast and truth")
    run_dir_args(forecast)
    forecast.add_argument("--data", required=True, help="the CSV series, with the run's date column and columns")
    forecast.add_argument("--origin", help="the first row to forecast: a row number (0 = the first after the header) "
                                           "or a date of the date column (default: after the last row)")
    forecast.add_argument("--output", help="write the forecast CSV here (default: stdout)")
    forecast.add_argument("--plot", help="write a PNG of history, forecast and (where the file has it) truth")
    forecast.add_argument("--channels", help="the columns to plot, comma-separated (default: the last column)")
    forecast.add_argument("--force", action="store_true", help="overwrite an existing --output or --plot")
    forecast.set_defaults(func=cmd_forecast)

    score = sub.add_parser("score", help="teacher-forced perplexity of target text")
    run_dir_args(score)
    score.add_argument("--src", help="source sentences (translation models)")
    score.add_argument("--tgt", required=True, help="target sentences, or text for a language model")
    score.add_argument("--json", action="store_true", help="print one JSON object")
    score.set_defaults(func=cmd_score)
