"""`attnlab translate | generate | predict | fill-mask`: outputs of a trained run (its scores: cli/evaluate.py;
image captions and answers: cli/images.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, cast

from attnlab.cli.common import (
    GENERATES,
    TRANSLATES,
    add_kv_cache_option,
    add_mask_predict_args,
    add_run_dir_args,
    add_search_args,
    add_weights_option,
    check_kv_cache,
    check_new_file,
    check_task_serves,
    device_of,
    load_run_for,
    search_of,
    write_output,
)
from attnlab.decode.limits import MAX_BATCH
from attnlab.errors import UsageError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from attnlab.data.tokenizers import Tokenizer
    from attnlab.decode.spec import Sample, Speculative
    from attnlab.nn.decoder_lm import DecoderLM
    from attnlab.nn.memory import TransformerXL


def cmd_translate(args: argparse.Namespace) -> None:
    from dataclasses import replace

    from attnlab.data.corpora import read_input_lines
    from attnlab.data.tokenizers import UNK
    from attnlab.decode.spec import Speculative
    from attnlab.decode.speculative import OWN_HEADS
    from attnlab.decode.translate import translate
    from attnlab.runs.checkpoint import load_draft

    search = search_of(args)
    check_new_file(args.output, args.force, "--output")  # now, not after the decoding
    model, tokenizers, cfg = load_run_for(args, TRANSLATES)
    if search.incremental:
        check_kv_cache(args, model)
    if args.draft == OWN_HEADS:
        raise UsageError("--draft heads: a translation model has no multi-token heads; give a draft run")
    if isinstance(search, Speculative):
        search = replace(search, draft=load_draft(args.draft, model, tokenizers, TRANSLATES))
    lines = read_input_lines(args.input)
    results = translate(
        model, tokenizers, lines, search, cast(int, cfg.longest_sequence) - 1, args.truncate, progress=True
    )  # -1: EOS; a translating family's longest_sequence is its max_len, never None
    if isinstance(search, Speculative):
        print(_speculation_line(search), file=sys.stderr)
    assert tokenizers["src"] is not None  # a translation run's
    unknown = [ids.count(UNK) for ids in tokenizers["src"].encode_batch(lines)]
    if sum(unknown):
        print(
            f"note: {sum(unknown)} unknown source tokens in {sum(n > 0 for n in unknown)} lines were read as <unk>",
            file=sys.stderr,
        )
    if args.nbest == 1:
        text = "".join(hyps[0][0] + "\n" for hyps in results)
    else:  # n-best lines: sentence index ||| hypothesis ||| score
        text = "".join(f"{i} ||| {hyp} ||| {score:.4f}\n" for i, hyps in enumerate(results) for hyp, score in hyps)
    write_output(args.output, text, args.force)


def cmd_generate(args: argparse.Namespace) -> None:
    import torch

    from attnlab.data.tokenizers import UNK

    # generate's options ask for sampling, or (--draft) speculative decoding of it
    search = cast("Sample | Speculative", search_of(args))
    if not 1 <= args.num_samples <= MAX_BATCH:
        raise UsageError(f"--num-samples must be between 1 and {MAX_BATCH} (got {args.num_samples:,})")
    model, tokenizers, _ = load_run_for(args, GENERATES)
    check_kv_cache(args, model)
    tok = tokenizers["tgt"]
    assert tok is not None  # a language model's
    prompt_ids = tok.encode(args.prompt)
    if not prompt_ids:
        raise UsageError("--prompt is empty after tokenisation; give at least one known token")
    if prompt_ids.count(UNK):  # as translate notes them
        print(
            f"note: {prompt_ids.count(UNK)} unknown prompt token{'s' * (prompt_ids.count(UNK) != 1)} "
            f"{'were' if prompt_ids.count(UNK) != 1 else 'was'} read as <unk>",
            file=sys.stderr,
        )
    positions = cast("DecoderLM | TransformerXL", model).embed.positional.max_positions  # the GENERATES families
    if positions is not None and len(prompt_ids) > positions:
        print(
            f"note: --prompt has {len(prompt_ids)} tokens; the model sees the last {positions} (its max_len)",
            file=sys.stderr,
        )
    prompt = torch.tensor([prompt_ids] * args.num_samples, device=next(model.parameters()).device)
    if args.seed is None:
        seed = cast("Sample", cast("Speculative", search).sampling if args.draft is not None else search).seed
        print(f"seed {seed} (--seed {seed} gives this text again)", file=sys.stderr)
    if args.draft is not None:
        search = _with_draft(args, cast("Speculative", search), model, tokenizers, prompt)
    rows = search.continue_prompt(model, prompt)
    if args.draft is not None:
        print(_speculation_line(cast("Speculative", search)), file=sys.stderr)
    for i, row in enumerate(rows):
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        print(args.prompt + tok.decode(row))


def _check_heads(args: argparse.Namespace, model: nn.Module) -> nn.Module | None:
    """``--draft heads``: the model drafts with its own multi-token heads, at most one token per head.
    Returns the draft model: None, the model itself."""
    heads = len(getattr(model, "heads", ()))
    if heads == 0:
        raise UsageError(
            f"--draft heads: {args.run_dir} has no multi-token heads (model.multi_token_heads is 0); "
            f"train one with --set model.multi_token_heads=K, or give a draft run"
        )
    if args.speculate > heads:
        raise UsageError(
            f"--speculate {args.speculate}: {args.run_dir} has {heads} multi-token heads, so its own draft "
            f"proposes at most {heads} tokens a pass"
        )
    return None


def _speculation_line(search: Speculative) -> str:
    stats = search.stats
    return (
        f"speculative decoding, k {search.k}: {stats.accepted} of {stats.proposed} draft tokens accepted "
        f"({stats.acceptance_rate:.1%}), {stats.tokens_per_pass:.2f} tokens per pass of the target"
    )


def _with_draft(
    args: argparse.Namespace,
    search: Speculative,
    model: nn.Module,
    tokenizers: dict[str, Tokenizer | None],
    prompt: torch.Tensor,
) -> Speculative:
    """``generate --draft``: the speculative search with its draft, the run (or None: the model's own
    heads), refused in one line where the prompt and the new tokens pass the models' positions."""
    from dataclasses import replace

    from attnlab.decode.speculative import OWN_HEADS
    from attnlab.runs.checkpoint import load_draft

    draft = (
        load_draft(args.draft, model, tokenizers, GENERATES) if args.draft != OWN_HEADS else _check_heads(args, model)
    )
    limits = [
        p
        for p in (
            cast("DecoderLM | TransformerXL", m).embed.positional.max_positions  # the GENERATES families
            for m in (model, draft)
            if m is not None
        )
        if p is not None
    ]
    if limits and prompt.shape[1] + args.max_new_tokens > min(limits):
        raise UsageError(
            f"--draft: speculative decoding stops at the models' positions ({min(limits)}); with this "
            f"prompt ask for at most {max(0, min(limits) - prompt.shape[1])} new tokens"
        )
    return replace(search, draft=draft)


def cmd_predict(args: argparse.Namespace) -> None:
    """The run's task reads the inputs (lines of text, image files) and gives each one's class
    probabilities; one line per input: [its name TAB] the best label TAB its probability."""
    from attnlab.runs.run_dir import RunDir
    from attnlab.tasks import TASKS, Predicts

    if not 1 <= args.batch_size <= MAX_BATCH:
        raise UsageError(f"--batch-size must be between 1 and {MAX_BATCH} (got {args.batch_size})")
    check_new_file(args.output, args.force, "--output")
    device_of(args)  # refused before any reading
    task = check_task_serves(args)
    if not isinstance(task, Predicts):
        raise UsageError(
            f"{args.run_dir} is a run of data.task '{task.name}', which lists `predict` among its "
            f"commands but predicts no classes (it has no predict, class_names and predict_options)"
        )
    model, _, _ = load_run_for(args, {})
    run = RunDir(args.run_dir)
    options = {name: getattr(args, name) for name in ("labels", "prompts") if getattr(args, name) is not None}
    name: str | None  # an option's, then an input's (None: a line of --input)
    for name in options:
        if name not in task.predict_options:
            takers = [t.name for t in TASKS.values() if name in getattr(t, "predict_options", ())]
            raise UsageError(
                f"--{name} is for runs of data.task {' or '.join(map(repr, takers))}; {args.run_dir} is a "
                f"run of data.task '{task.name}'"
            )
    labels = task.class_names(run, **options)
    out = []
    for name, p in task.predict(model, run, args.inputs, args.input, args.batch_size, **options):
        if p is None:  # a blank line gives a blank line
            out.append("\n")
            continue
        best = max(range(len(p)), key=p.__getitem__)
        named = {"input": name} if name is not None else {}
        out.append(
            json.dumps(named | {"label": labels[best], "probabilities": dict(zip(labels, p))}) + "\n"
            if args.json
            else "".join(f"{field}\t" for field in named.values()) + f"{labels[best]}\t{p[best]:.4f}\n"
        )
    write_output(args.output, "".join(out), args.force)


def cmd_fill_mask(args: argparse.Namespace) -> None:
    from attnlab.runs.init import untrained_of
    from attnlab.runs.run_dir import RunDir
    from attnlab.tasks.masked_lm import fill_mask

    if not 1 <= args.top_k <= 1000:
        raise UsageError(f"--top-k must be between 1 and 1000 (got {args.top_k})")
    model, tokenizers, _ = load_run_for(args, {})
    if any(name.startswith("mlm_head.") for name in untrained_of(RunDir(args.run_dir), model)):
        raise UsageError(
            f"{args.run_dir}: its masked-LM head was never trained (imported without one, as a "
            f"Hugging Face BertModel is); fill-mask needs a run trained or imported with it"
        )
    assert tokenizers["src"] is not None  # a masked LM's
    fillers = fill_mask(model, tokenizers["src"], args.text, args.top_k)
    if args.json:
        print(json.dumps([[{"token": token, "probability": p} for token, p in row] for row in fillers]))
        return
    for n, row in enumerate(fillers, start=1):
        print(f"[MASK] {n}: " + ", ".join(f"{token} ({p:.3f})" for token, p in row))


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `translate, generate, predict, caption and fill-mask` to the command line."""

    def draft_options(p: argparse.ArgumentParser, keeps: str) -> None:
        p.add_argument(
            "--draft",
            metavar="RUN|heads",
            help=f"speculative decoding: a smaller run with the same tokenizers proposes tokens that this "
            f"model checks in one pass, or 'heads', the model's own multi-token heads (a run "
            f"directory named heads: ./heads); {keeps}",
        )
        p.add_argument(
            "--speculate",
            type=int,
            default=4,
            metavar="K",
            help="with --draft: tokens the draft proposes per pass of the model (default 4)",
        )

    translate = sub.add_parser("translate", help="translate lines of text (stdin to stdout by default)")
    add_run_dir_args(translate)
    add_search_args(translate)
    add_mask_predict_args(translate)
    draft_options(translate, "greedy (--beam 1), and the same output as greedy decoding")
    translate.add_argument(
        "--nbest", type=int, default=1, help="print the K best per sentence: index ||| hypothesis ||| score"
    )
    translate.add_argument("--input", help="source file, one sentence per line (default: stdin)")
    translate.add_argument("--output", help="output file (default: stdout)")
    translate.add_argument("--force", action="store_true", help="overwrite an existing --output")
    translate.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default 64)")
    translate.add_argument("--max-len", type=int, help="most output tokens (default: source length + 50)")
    translate.add_argument("--min-len", type=int, default=0, help="fewest output tokens before EOS (default 0)")
    translate.add_argument(
        "--truncate",
        action="store_true",
        help="cut source lines longer than the model's max_len (default: refuse them)",
    )
    translate.set_defaults(func=cmd_translate)

    generate = sub.add_parser("generate", help="sample text from a language model")
    add_run_dir_args(generate)
    generate.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    generate.add_argument(
        "--max-new-tokens", type=int, default=200, help="tokens to sample after the prompt (default 200)"
    )
    generate.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="divide the logits by T before sampling: below 1 is surer, above 1 more varied (default 1)",
    )
    generate.add_argument(
        "--top-k", type=int, help="sample among the K most likely tokens (0: no limit, as without it)"
    )
    generate.add_argument("--top-p", type=float, help="sample from the smallest set of probability >= P")
    generate.add_argument(
        "--seed",
        type=int,
        help="random seed: the same seed gives the same text (default: a new one each time, printed on stderr)",
    )
    generate.add_argument("--num-samples", type=int, default=1, help="independent samples of the prompt (default 1)")
    draft_options(generate, "the text keeps this model's distribution (with --top-k 1, exactly its greedy text)")
    add_kv_cache_option(generate)
    add_weights_option(generate)
    generate.set_defaults(func=cmd_generate)

    predict = sub.add_parser(
        "predict", help="classify lines of text or image files: one label and its probability per input"
    )
    add_run_dir_args(predict)
    predict.add_argument("inputs", nargs="*", metavar="IMAGE", help="image files (a run of image_classification)")
    predict.add_argument("--input", help="text classifiers: one text per line, or text_a TAB text_b (default: stdin)")
    predict.add_argument("--output", help="output file (default: stdout)")
    predict.add_argument("--force", action="store_true", help="overwrite an existing --output")
    predict.add_argument("--json", action="store_true", help="one JSON object per line, with every class's probability")
    predict.add_argument("--batch-size", type=int, default=64, help="inputs per batch (default 64)")
    predict.add_argument(
        "--labels",
        help="zero-shot runs (data.task contrastive): the classes to choose among, "
        "comma-separated (default: the run's data.labels)",
    )
    predict.add_argument(
        "--prompts",
        help="zero-shot runs: '|'-separated templates naming the class as {label}, e.g. "
        "'a small {label}|a large {label}' (default: the run's data.prompts)",
    )
    predict.set_defaults(func=cmd_predict)

    fill = sub.add_parser("fill-mask", help="the most likely words for each [MASK] of a text (masked-LM runs)")
    add_run_dir_args(fill)
    fill.add_argument("text", help='a text with one or more [MASK], e.g. "the film was [MASK] ."')
    fill.add_argument("--top-k", type=int, default=5, help="fillers per [MASK] (default 5)")
    fill.add_argument("--json", action="store_true", help="print one JSON list: per [MASK], tokens and probabilities")
    fill.set_defaults(func=cmd_fill_mask)
