"""The `attnlab` command: a thin shell over library functions.

User errors (AttnlabError) are printed as one line, ``error: <message>``, with the error class's exit
code; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from attnlab import __version__
from attnlab.errors import AttnlabError, Interrupted, UsageError

CONFIGS = Path(__file__).resolve().parent.parent / "configs"  # the presets of a source checkout


def _describe_model(cfg, vocab: str) -> str:
    """One line: the architecture and the sizes that matter for it."""
    if cfg.arch == "rnn":
        return f"rnn, hidden size {cfg.d_model}, {cfg.encoder_layers}+{cfg.decoder_layers} layers, vocab {vocab}"
    layers = f"{cfg.decoder_layers}" if cfg.arch == "decoder_lm" else f"{cfg.encoder_layers}+{cfg.decoder_layers}"
    return f"{cfg.arch}, d_model {cfg.d_model}, {cfg.n_heads} heads, {layers} layers, d_ff {cfg.d_ff}, vocab {vocab}"


def _info_model_config(args: argparse.Namespace):
    """The model ``info`` counts: (a ModelConfig, None) when its vocabulary is known, else (None, a
    function from vocabulary size to ModelConfig). The config is a model config, a training config
    (its model section; the vocabulary from --vocab-size, or from a built-in task's tokenizer) or a
    run directory (its config.yaml), with --set overrides."""
    from attnlab.config import ModelConfig, RunConfig, apply_overrides, read_config_file
    from attnlab.errors import ConfigError
    from attnlab.train.checkpoint import RunDir
    from attnlab.train.run import planned_model_config

    path = Path(args.config)
    if path.is_dir():
        path = RunDir(path).config
        if not path.is_file():
            raise UsageError(f"{args.config} is a directory but not a run directory (no config.yaml)")
    sections = read_config_file(path)
    apply_overrides(sections, args.set or [])
    where = " ".join([str(path), *(f"--set {expr}" for expr in args.set or [])])
    model = sections.get("model")
    if isinstance(model, dict) and "vocab_size" in model:  # a model config, or a run's complete one
        if args.vocab_size is not None:
            model = {**model, "vocab_size": args.vocab_size}
        try:
            return ModelConfig.from_dict(model), None
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
    if "data" not in sections:
        raise ConfigError(f"{where}: section 'model' needs the field 'vocab_size' (or give --vocab-size), or the "
                          f"file needs a data section whose tokenizer sets it")
    cfg = RunConfig.from_sections(sections, where)
    with_vocab = planned_model_config(cfg)
    if args.vocab_size is not None:
        return with_vocab(args.vocab_size), None
    if cfg.data.format == "builtin":  # generated in memory: its tokenizer is quick to build
        return planned_model_config(cfg, from_data=True)(0), None
    return None, with_vocab


def cmd_info(args: argparse.Namespace) -> None:
    import torch

    from attnlab.analysis.budget import budget_report, format_budget_report, format_parameter_report, parameter_report
    from attnlab.nn.build import build_model

    if min(args.seq_len, args.batch) < 1 or (args.src_len is not None and args.src_len < 1):
        raise UsageError("--seq-len, --src-len and --batch must be at least 1")
    if args.vocab_size is not None and args.vocab_size < 1:
        raise UsageError(f"--vocab-size must be at least 1 (got {args.vocab_size})")
    cfg, with_vocab = _info_model_config(args)

    def count(model_cfg) -> dict:
        with torch.device("meta"):  # shapes only: no memory for the weights, no time to initialise them
            return parameter_report(build_model(model_cfg))

    if cfg is None:  # a training config whose vocabulary comes from its data files: parameters = a + b V
        if args.memory or args.flops:
            raise UsageError(f"{args.config}: the vocabulary comes from the data; give --vocab-size V for "
                             f"--memory and --flops")
        small, large = (count(with_vocab(v))["params_total"] for v in (1000, 2000))
        per_entry = (large - small) // 1000
        fixed = small - 1000 * per_entry
        shape = with_vocab(1000)
        if args.json:
            print(json.dumps({"config": str(args.config), "arch": shape.arch, "vocab_size": None,
                              "params_without_vocab": fixed, "params_per_vocab_entry": per_entry}))
            return
        print(f"{args.config}: {_describe_model(shape, 'V')}")
        print(f"parameters: {fixed:,} + {per_entry:,} x V, V the vocabulary size, which the tokenizer sets from "
              f"the data (--vocab-size V counts it exactly)")
        return
    report = {"config": str(args.config), "arch": cfg.arch, **count(cfg)}
    budget = None
    if args.memory or args.flops:  # measured on the meta device
        try:
            budget = budget_report(cfg, args.seq_len, args.batch, args.src_len)
        except ValueError as err:
            raise UsageError(str(err)) from None
        report["budget"] = {k: v for k, v in budget.items()
                            if (args.flops or k != "flops") and (args.memory or not k.endswith("_memory"))}
    if args.json:
        print(json.dumps(report))
        return
    print(f"{args.config}: {_describe_model(cfg, f'{cfg.vocab_size:,}')}")
    print(format_parameter_report(report))
    if budget is not None:
        print()
        print(format_budget_report(report["budget"]))


def cmd_inspect(args: argparse.Namespace) -> None:
    from attnlab.analysis.inspect import entropy_over_split, inspect_run

    _check_beam(args)
    if (args.src is None) == (args.split is None):
        raise UsageError("give --src (one sentence: figures) or --split (mean entropies over a split of the run's data)")
    if args.split is not None:
        entropies = entropy_over_split(args.run_dir, args.split, args.checkpoint)
        for name, values in entropies.items():
            print(f"{name:<34} mean {sum(values) / len(values):.3f}  per head " + " ".join(f"{v:.3f}" for v in values))
        return
    out = Path(args.out) if args.out else Path(args.run_dir) / "inspect"
    if out.exists() and any(out.iterdir()) and not args.force:
        raise UsageError(f"{out} already exists; pass --force to overwrite its figures, or choose another --out")
    summary = inspect_run(args.run_dir, args.src, args.tgt, out, args.beam, args.checkpoint)
    for name, entry in summary["modules"].items():
        entropy = " ".join(f"{e:.2f}" for e in entry["entropy"])
        print(f"{name:<34} entropy per head (uniform {entry['uniform_entropy']:.2f}): {entropy}")
    print(f"target: {summary['target']}")
    print(f"{len(summary['files'])} figures and summary.json in {out}")


def cmd_prune(args: argparse.Namespace) -> None:
    from attnlab.analysis.plots import pruning_plot
    from attnlab.analysis.prune import prune_run

    _check_new_file(args.plot, args.force, "--plot")  # now, not after the measurements
    summary = prune_run(args.run_dir, args.fraction, args.split, args.out, args.limit, log=_stderr)
    for r in summary["results"]:
        text = f"  BLEU {r['bleu']:.2f}  exact match {r['exact_match']:.2%}" if "bleu" in r else ""
        print(f"{r['heads_pruned']:>3}/{r['heads_total']} heads pruned ({r['fraction']:.0%}): "
              f"{args.split} loss {r['valid_loss']:.4f}{text}")
    if args.plot:
        metric = "bleu" if "bleu" in summary["results"][0] else "valid_loss"
        pruning_plot([r["fraction"] for r in summary["results"]], [r[metric] for r in summary["results"]],
                     metric, Path(args.plot))
        print(f"plot: {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    if args.out:
        print(f"pruned model: {args.out}")


def _default_run_dir(stem: str) -> str:
    return str(Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}")


def _new_run_dir(out: str | None, stem: str, resume: bool = False) -> Path:
    """The run directory to write: ``out``, or runs/STEM-TIMESTAMP; an existing, non-empty one is
    only taken to resume it, never overwritten."""
    from attnlab.files import is_leftover

    path = Path(out) if out else Path(_default_run_dir(stem))
    if resume:
        if not path.is_dir():
            raise UsageError(f"--resume: {path} is not a run directory (give it with --out)")
    elif path.exists() and (not path.is_dir() or any(not (p.is_file() and is_leftover(p)) for p in path.iterdir())):
        raise UsageError(f"{path} already exists; pass --resume to continue that run, or choose another --out")
    return path


def _saved_so_far(out: Path) -> str:
    """What an interrupted training left in ``out``, and how to go on."""
    from attnlab.train.checkpoint import RunDir

    steps = RunDir(out).steps() if out.is_dir() else []
    if steps:
        return (f"interrupted; {out} has its checkpoints up to step {steps[-1]}: continue with "
                f"`attnlab train --out {out} --resume`")
    return f"interrupted before the first checkpoint; `attnlab train --out {out} --resume` starts it again from step 0"


def _run_config_file(run_dir: str) -> Path:
    from attnlab.train.checkpoint import RunDir

    config = RunDir(run_dir).config
    if not config.is_file():
        raise UsageError(f"--resume: {run_dir} is not a run directory (no config.yaml)")
    return config


def cmd_train(args: argparse.Namespace) -> None:
    from attnlab.config import RunConfig
    from attnlab.train.distributed import joined_world
    from attnlab.train.loop import resolve_device
    from attnlab.train.run import train_run

    if args.config is not None:
        cfg = RunConfig.from_file(args.config, args.set or [])
    elif args.resume and args.out:  # the run's own config, and any --set changes to it
        cfg = RunConfig.from_file(_run_config_file(args.out), args.set or [], of_a_run=True)
    else:
        raise UsageError("train needs a CONFIG file (or --out RUN --resume, to continue a run with its own config)")
    stem = Path(args.config or args.out).stem
    with joined_world(resolve_device(cfg.train.device).type) as world:  # under torchrun: this rank's place
        out = _new_run_dir(world.broadcast(args.out or _default_run_dir(stem)) if world else args.out, stem,
                           args.resume)
        if world:
            world.barrier()  # every rank has checked the directory before rank 0 writes into it
        try:
            summary = train_run(cfg, out, resume=args.resume, world=world, allow_changes=args.allow_changes)
        except KeyboardInterrupt:
            raise Interrupted(_saved_so_far(out)) from None
    if world is None or world.is_main:
        print(json.dumps({k: v for k, v in summary.items() if k != "last_eval"} | summary["last_eval"]))
        print(f"run directory: {out}")


def cmd_demo(args: argparse.Namespace) -> None:
    from attnlab.config import RunConfig
    from attnlab.eval.metrics import exact_match
    from attnlab.files import atomic_write_text
    from attnlab.train.checkpoint import RunDir, load_run
    from attnlab.train.loop import decode_split
    from attnlab.train.run import train_run

    cfg = RunConfig.from_file(CONFIGS / "scan.yaml", args.set or [])
    out = _new_run_dir(args.out, "demo")
    print("attnlab demo: a Transformer learns SCAN (commands -> actions) from scratch on this machine.")
    summary = train_run(cfg, out)
    # Decode the held-out split with the model as saved, to show the run directory is complete.
    model, tokenizers, _ = load_run(out)
    triples = decode_split(model, RunDir(out).read_data(tokenizers), "test", progress=True)
    em = exact_match([h for _, _, h in triples], [r for _, r, _ in triples])
    for src, ref, hyp in triples[:5]:
        print(f"\n  source:    {src}\n  reference: {ref}\n  output:    {hyp}   [{'ok' if hyp == ref else 'WRONG'}]")
    summary |= {"exact_match": em, "test_examples": len(triples)}
    atomic_write_text(RunDir(out).summary, json.dumps(summary, indent=2))
    print(f"\nexact match on {len(triples)} held-out commands: {em:.1%} "
          f"({summary['train_seconds']:.0f} s of training, {summary['n_params']:,} parameters)")
    print(f"run directory: {out}")


def cmd_average(args: argparse.Namespace) -> None:
    from attnlab.train.checkpoint import write_average

    path, steps = write_average(args.run_dir, args.last, args.force)
    print(f"averaged steps {', '.join(map(str, steps))} into {path}")


def _read_input_lines(path: str | None) -> list[str]:
    """Lines of --input FILE, or of standard input: read, checked and split the same way. Empty
    input gives empty output, with a note, as it would from any filter."""
    from attnlab.data.corpora import check_lines, decode_utf8, read_text, split_lines

    name = path or "<stdin>"
    text = decode_utf8(sys.stdin.buffer.read(), name) if path is None else read_text(path)
    lines = check_lines(split_lines(text), name, allow_empty=True)
    if not lines:
        print(f"note: {name} is empty: nothing to translate", file=sys.stderr)
    return lines


def _check_new_file(path: str | None, force: bool, option: str) -> None:
    """Refuse, before any work is done, an output ``path`` that is a directory, or that exists
    when ``force`` is not given."""
    if path is None:
        return
    if Path(path).is_dir():
        raise UsageError(f"{option} {path} is a directory; give a file name")
    if Path(path).exists() and not force:
        raise UsageError(f"{path} already exists; pass --force to overwrite it")


def _write_output(path: str | None, text: str, force: bool) -> None:
    """To --output FILE (atomically; an existing file only with --force), or to standard output."""
    from attnlab.files import atomic_write_text

    if path is None:
        sys.stdout.write(text)
        return
    _check_new_file(path, force, "--output")
    atomic_write_text(path, text)


def _stderr(line: str) -> None:
    """A progress or log line, on stderr at once."""
    print(line, file=sys.stderr, flush=True)


SEQ2SEQ = ("encoder_decoder", "rnn")  # the archs that translate (Transformer and recurrent)


# Decoding limits: beyond these a request is a mistake, not a workload (docs/reliability.md).
MAX_BATCH, MAX_BEAM, MAX_NEW_TOKENS = 1024, 64, 100_000


def _load(args: argparse.Namespace, archs: tuple[str, ...]):
    """The run's model, tokenizers and model config, after checking the decoding options against it."""
    from attnlab.train.checkpoint import load_run

    model, tokenizers, cfg = load_run(args.run_dir, args.checkpoint)
    if cfg.arch not in archs:
        raise UsageError(f"{args.run_dir} holds a model of arch '{cfg.arch}'; this command needs "
                         f"{' or '.join(map(repr, archs))}")
    if (getattr(args, "max_len", None) or 0) > cfg.max_len:
        raise UsageError(f"--max-len {args.max_len} is beyond the model's max_len ({cfg.max_len} positions)")
    return model, tokenizers, cfg


def cmd_translate(args: argparse.Namespace) -> None:
    from attnlab.data.tokenizers import UNK
    from attnlab.decode.translate import translate

    _check_beam(args)
    _check_new_file(args.output, args.force, "--output")  # now, not after the decoding
    model, tokenizers, cfg = _load(args, SEQ2SEQ)
    lines = _read_input_lines(args.input)
    results = translate(model, tokenizers, lines, args.beam, args.lenpen, args.nbest, not args.no_cache,
                        args.batch_size, args.max_len, args.min_len, cfg.max_len - 1, args.truncate,  # -1: EOS
                        progress=True)
    unknown = [ids.count(UNK) for ids in tokenizers["src"].encode_batch(lines)]
    if sum(unknown):
        print(f"note: {sum(unknown)} unknown source tokens in {sum(n > 0 for n in unknown)} lines were read as "
              f"<unk>", file=sys.stderr)
    if args.nbest == 1:
        text = "".join(hyps[0][0] + "\n" for hyps in results)
    else:  # n-best lines: sentence index ||| hypothesis ||| score
        text = "".join(f"{i} ||| {hyp} ||| {score:.4f}\n" for i, hyps in enumerate(results) for hyp, score in hyps)
    _write_output(args.output, text, args.force)


def cmd_generate(args: argparse.Namespace) -> None:
    import torch

    from attnlab.decode.search import sample

    if args.temperature <= 0:
        raise UsageError(f"--temperature must be > 0 (got {args.temperature}); use --top-k 1 for greedy")
    if args.top_k is not None and args.top_k < 1:
        raise UsageError(f"--top-k must be at least 1 (got {args.top_k})")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1] (got {args.top_p})")
    if not 0 <= args.max_new_tokens <= MAX_NEW_TOKENS or not 1 <= args.num_samples <= MAX_BATCH:
        raise UsageError(f"--max-new-tokens must be between 0 and {MAX_NEW_TOKENS:,} and --num-samples between 1 "
                         f"and {MAX_BATCH}")
    model, tokenizers, _ = _load(args, ("decoder_lm",))
    tok = tokenizers["tgt"]
    prompt_ids = tok.encode(args.prompt)
    if not prompt_ids:
        raise UsageError("--prompt is empty after tokenisation; give at least one known token")
    positions = model.embed.positional.max_positions
    if positions is not None and len(prompt_ids) > positions:
        print(f"note: --prompt has {len(prompt_ids)} tokens; the model sees the last {positions} "
              f"(its max_len)", file=sys.stderr)
    prompt = torch.tensor([prompt_ids] * args.num_samples)
    seed = args.seed
    if seed is None:
        seed = secrets.randbelow(2 ** 31)
        print(f"seed {seed} (--seed {seed} gives this text again)", file=sys.stderr)
    generator = torch.Generator().manual_seed(seed)
    rows = sample(model, prompt=prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                  top_k=args.top_k, top_p=args.top_p, generator=generator, stop_at_eos=False)
    for i, row in enumerate(rows):
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        print(args.prompt + tok.decode(row))


def cmd_evaluate(args: argparse.Namespace) -> None:
    from attnlab.data.corpora import read_lines
    from attnlab.eval.evaluate import evaluate

    _check_beam(args)
    model, tokenizers, _ = _load(args, SEQ2SEQ)
    if args.split is not None:
        if args.src or args.ref:
            raise UsageError("give either --split or --src and --ref")
        sources, references = _run_split(args.run_dir, args.split, tokenizers)
    elif args.src and args.ref:
        sources, references = read_lines(args.src, allow_empty=True), read_lines(args.ref, allow_empty=True)
    else:
        raise UsageError("give --src and --ref files, or --split (a split of the run's own data)")
    if len(sources) != len(references):
        raise UsageError(f"{args.src} has {len(sources)} lines but {args.ref} has {len(references)}")
    result = evaluate(model, tokenizers, sources, references, args.beam, args.lenpen, not args.no_cache, progress=True)
    result.pop("hypotheses")
    if args.json:
        print(json.dumps(result))
    else:
        print(f"BLEU  {result['bleu']:.2f}  {result['bleu_signature']}")
        print(f"chrF  {result['chrf']:.2f}  {result['chrf_signature']}")
        print(f"exact match  {result['exact_match']:.2%}   perplexity of the references  {result['ppl']:.3f}")
        print(f"({result['sentences']} sentences, beam {result['beam']}, lenpen {result['lenpen']})")


def _run_split(run_dir: str, split: str, tokenizers) -> tuple[list[str], list[str]]:
    """Sources and references of a split of the data a run was trained with."""
    from attnlab.train.checkpoint import RunDir

    data = RunDir(run_dir).read_data(tokenizers, split)
    return [e.src for e in data.splits[split]], [e.tgt for e in data.splits[split]]


def cmd_score(args: argparse.Namespace) -> None:
    from attnlab.data.batching import collate_pairs, lm_eval_blocks
    from attnlab.data.corpora import read_lines, read_text
    from attnlab.train.checkpoint import load_run
    from attnlab.train.loop import evaluate

    model, tokenizers, cfg = load_run(args.run_dir, args.checkpoint)
    if cfg.arch == "decoder_lm":
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
    _emit(record, args.json, f"perplexity {result['ppl']:.4g}: {result['loss']:.4f} nats per token over "
                             f"{result['tokens']:,} tokens ({args.tgt})")


def _emit(record: dict, as_json: bool, line: str) -> None:
    print(json.dumps(record) if as_json else line, flush=True)


def _emit_comparison(r: dict, as_json: bool) -> None:
    """One benchmark figure: value and unit, and the reference's figure and the ratio if any."""
    if "skipped" in r:
        line = f"{r['name']:<26} vs {r['reference']}: skipped ({r['skipped']})"
    else:
        line = f"{r['name']:<26}{r['value']:>12,.1f} {r['unit']}"
        if "ratio" in r:
            line += f"   {r['reference']}: {r['reference_value']:,.1f}   ratio x{r['ratio']:.2f}"
        elif "skipped_reference" in r:
            line += f"   {r['reference']}: skipped ({r['skipped_reference']})"
    _emit(r, as_json, line)


def cmd_bench_train(args: argparse.Namespace) -> None:
    from attnlab.bench.train import bench_train

    if args.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    print(f"training step (forward, loss, backward, clip, Adam): d_model 256, 3+3 layers, 4 heads, d_ff 1024, "
          f"vocabulary 8000, dropout 0.1, 64 pairs of 24 + 24 tokens; interleaved, median of {args.repeats}",
          file=sys.stderr)
    for r in bench_train(tuple(args.precision), args.repeats, not args.no_hf):
        _emit_comparison(r, args.json)


def cmd_bench_decode(args: argparse.Namespace) -> None:
    from attnlab.bench.decode import bench_decode

    if min(args.repeats, args.batch, args.new_tokens) < 1 or args.new_tokens > 500:
        raise UsageError("--repeats and --batch must be at least 1, --new-tokens between 1 and 500")
    print(f"decoding {args.batch} sources of 24 tokens, exactly {args.new_tokens} new tokens each, d_model 256, "
          f"3+3 layers, vocabulary 8000; interleaved, median of {args.repeats}", file=sys.stderr)
    for r in bench_decode(args.batch, args.new_tokens, repeats=args.repeats, with_hf=not args.no_hf):
        _emit_comparison(r, args.json)


def cmd_bench_lm(args: argparse.Namespace) -> None:
    from attnlab.bench.lm import bench_lm

    if args.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    print("character LM of configs/shakespeare_char.yaml: training (batch 12 x 64) and sampling with the cache",
          file=sys.stderr)
    for r in bench_lm(args.repeats):
        _emit_comparison(r, args.json)


def cmd_bench_models(args: argparse.Namespace) -> None:
    from attnlab.bench.models import MODELS, REFERENCE, bench_models

    if min(args.repeats, args.batch_tokens, args.decode_batch, *args.lengths) < 1:
        raise UsageError("--lengths, --batch-tokens, --decode-batch and --repeats must be at least 1")
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        raise UsageError(f"unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}")
    print(f"train: one optimizer step on {args.batch_tokens} // T pairs of T + T tokens; decode: greedy with the "
          f"cache, {args.decode_batch} sources of T tokens, T new tokens; {args.precision}; median of "
          f"{args.repeats}; vocabulary 8000, random tokens", file=sys.stderr)
    for r in bench_models(tuple(args.lengths), tuple(args.models), args.batch_tokens, args.decode_batch,
                          args.precision, args.repeats):
        ratio = f"   x{r['ratio']:.2f} vs {REFERENCE}" if "ratio" in r else ""
        _emit(r, args.json, f"{r['name']:<7}{r['model']:<19} T={r['seq_len']:<5} batch {r['batch']:<4}"
                            f"{r['value']:>10.1f} tokens/s{ratio}")


def cmd_bench_attention(args: argparse.Namespace) -> None:
    from attnlab.bench.attention import GiB, backends, bench_attention, plot_attention

    known = backends(args.head_dim)
    unknown = sorted(set(args.backends) - set(known))
    if unknown:
        raise UsageError(f"unknown backend {unknown[0]!r}; choose from {', '.join(known)}")
    if min(args.batch, args.heads, args.head_dim, args.repeats, *args.lengths) < 1:
        raise UsageError("--lengths, --batch, --heads, --head-dim and --repeats must be at least 1")
    if not Path("/proc/self/clear_refs").exists():
        raise UsageError("bench attention measures peak memory through Linux's /proc/self/clear_refs")
    _check_new_file(args.plot, args.force, "--plot")
    print(f"attention backends, batch {args.batch}, {args.heads} heads of {args.head_dim}, float32, "
          f"{'causal' if not args.no_causal else 'no mask'}; median of {args.repeats}; peak memory above the inputs",
          file=sys.stderr)
    records = []
    for r in bench_attention(tuple(args.lengths), tuple(args.backends), args.batch, args.heads, args.head_dim,
                             not args.no_causal, args.repeats, args.memory_budget_gib * GiB, args.time_limit):
        records.append(r)
        what = (f"skipped: {r['skipped']}" if "skipped" in r
                else f"{r['seconds']:>10.4f} s  {r['peak_bytes'] / 2**20:>10.1f} MiB")
        _emit(r, args.json, f"{r['backend']:<8} T={r['seq_len']:<6} {r['pass']:<17} {what}")
    if args.plot:
        plot_attention(records, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)


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
          log=_stderr)
    print(f"{out}: {', '.join(f.name for f in dataset.files)}, sha256 verified (source and licence: {out}/README.md)")


def _check_beam(args: argparse.Namespace) -> None:
    if not 1 <= args.beam <= MAX_BEAM:
        raise UsageError(f"--beam must be between 1 and {MAX_BEAM} (got {args.beam})")
    if not 1 <= getattr(args, "batch_size", 1) <= MAX_BATCH:
        raise UsageError(f"--batch-size must be between 1 and {MAX_BATCH} (got {args.batch_size})")
    for name in ("max_len", "min_len"):
        if (getattr(args, name, None) or 0) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0")
    if getattr(args, "max_len", None) is not None and getattr(args, "min_len", 0) > args.max_len:
        raise UsageError(f"--min-len ({args.min_len}) must not exceed --max-len ({args.max_len})")
    if not 1 <= getattr(args, "nbest", 1) <= args.beam:
        raise UsageError(f"--nbest must be between 1 and --beam ({args.beam})")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors through the one error path (exit code 2, one line)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        from attnlab.errors import UsageError

        raise UsageError(f"{self.prog}: {message}")


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnlab", description="The Transformer family end to end.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    info = sub.add_parser("info", help="parameter counts of a model config")
    info.add_argument("config", help="a model or training config (YAML or JSON), or a run directory")
    info.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                      help="override one config field, e.g. --set model.n_layers=4 (repeatable)")
    info.add_argument("--vocab-size", type=int, metavar="V",
                      help="count with this vocabulary size (a training config's tokenizer otherwise sets it from "
                           "the data)")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.add_argument("--memory", action="store_true", help="training and inference memory (meta device)")
    info.add_argument("--flops", action="store_true", help="FLOPs split into attention, FFN and output")
    info.add_argument("--seq-len", type=int, default=512, help="tokens per sequence for --memory/--flops")
    info.add_argument("--src-len", type=int, help="source tokens (encoder-decoder; default --seq-len)")
    info.add_argument("--batch", type=int, default=32, help="sequences per batch for --memory/--flops")
    info.set_defaults(func=cmd_info)

    inspect = sub.add_parser("inspect", help="attention heatmaps, alignments and head entropies for one sentence")
    inspect.add_argument("run_dir", help="a run directory written by `attnlab train`")
    inspect.add_argument("--src", help="source sentence (or the text, for a language model)")
    inspect.add_argument("--split", help="instead of --src: mean entropy per layer and head over this split")
    inspect.add_argument("--tgt", help="target sentence (default: the model's beam-search output)")
    inspect.add_argument("--out", help="directory for the figures (default: RUN_DIR/inspect)")
    inspect.add_argument("--force", action="store_true", help="overwrite figures in an existing --out")
    inspect.add_argument("--beam", type=int, default=4,
                         help="beam size of the search that makes the target when --tgt is not given (default 4)")
    inspect.add_argument("--checkpoint", default="best", help="best, last, average or a step number")
    inspect.set_defaults(func=cmd_inspect)

    prune = sub.add_parser("prune", help="rank heads by importance, prune the least important, measure")
    prune.add_argument("run_dir", help="a run directory written by `attnlab train`")
    prune.add_argument("--fraction", type=float, nargs="+", required=True,
                       help="fraction(s) of all heads to prune, e.g. 0.2 0.4 0.6")
    prune.add_argument("--out", help="write the pruned model (one --fraction) as a new run directory")
    prune.add_argument("--split", default="valid", help="the run's data split to rank and measure on")
    prune.add_argument("--limit", type=int, help="decode at most this many sentences per measurement")
    prune.add_argument("--plot", help="write the metric against the fraction pruned to this PNG")
    prune.add_argument("--force", action="store_true", help="overwrite an existing --plot file")
    prune.add_argument("--json", action="store_true", help="also print the whole summary as JSON")
    prune.set_defaults(func=cmd_prune)

    train = sub.add_parser("train", help="train a model from a config file")
    train.add_argument("config", nargs="?",
                       help="YAML or JSON config with model, data and train sections (with --resume: the run's own "
                            "config.yaml when left out)")
    train.add_argument("--out", help="run directory (default: runs/CONFIG-TIMESTAMP)")
    train.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                       help="override one config field, e.g. --set train.max_steps=200 (repeatable)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its newest checkpoint, with the run's own config")
    train.add_argument("--allow-changes", action="store_true",
                       help="with --resume: train on with train settings that differ from the run's (from CONFIG "
                            "or --set); they are recorded in RUN/config_changes.jsonl. Model and data never change")
    train.set_defaults(func=cmd_train)

    average = sub.add_parser("average", help="average the newest checkpoints of a run (as the paper does)")
    average.add_argument("run_dir", help="a run directory written by `attnlab train`")
    average.add_argument("--last", type=int, default=5, help="how many of the newest checkpoints (default 5)")
    average.add_argument("--force", action="store_true", help="replace the run's existing average")
    average.set_defaults(func=cmd_average)

    def run_dir_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("run_dir", help="a run directory written by `attnlab train`")
        p.add_argument("--checkpoint", default="best", help="best (default), last, average, or a step number")

    def search_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--beam", type=int, default=4, help="beam size; 1 = greedy (default 4, as the paper)")
        p.add_argument("--lenpen", type=float, default=0.6, help="GNMT length penalty alpha (default 0.6)")
        p.add_argument("--no-cache", action="store_true", help="recompute every prefix (same output, slower)")

    translate = sub.add_parser("translate", help="translate lines of text (stdin to stdout by default)")
    run_dir_args(translate)
    search_args(translate)
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
    generate.set_defaults(func=cmd_generate)

    evaluate = sub.add_parser("evaluate", help="BLEU, chrF, exact match and perplexity on a test set")
    run_dir_args(evaluate)
    search_args(evaluate)
    evaluate.add_argument("--src", help="source sentences, one per line")
    evaluate.add_argument("--ref", help="reference translations, one per line")
    evaluate.add_argument("--split", help="instead of files: a split of the run's own data (valid, test)")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")
    evaluate.set_defaults(func=cmd_evaluate)

    score = sub.add_parser("score", help="teacher-forced perplexity of target text")
    run_dir_args(score)
    score.add_argument("--src", help="source sentences (translation models)")
    score.add_argument("--tgt", required=True, help="target sentences, or text for a language model")
    score.add_argument("--json", action="store_true", help="print one JSON object")
    score.set_defaults(func=cmd_score)

    bench = sub.add_parser("bench", help="benchmarks (timings as ratios against a reference in the same run)")
    bench_sub = bench.add_subparsers(dest="suite", required=True, parser_class=_Parser)

    def suite(name: str, help: str, func: Callable, repeats: int, hf: bool = False) -> argparse.ArgumentParser:
        """A benchmark command with the options they all share."""
        parser = bench_sub.add_parser(name, help=help)
        parser.add_argument("--repeats", type=int, default=repeats,
                            help=f"timed repetitions of each measurement; the median is reported (default {repeats})")
        parser.add_argument("--json", action="store_true", help="one JSON object per measurement")
        if hf:
            parser.add_argument("--no-hf", action="store_true", help="leave out the Hugging Face reference")
        parser.set_defaults(func=func)
        return parser

    train = suite("train", "training tokens/s against torch.nn.Transformer and Marian", cmd_bench_train, 10, hf=True)
    train.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                       help="precisions to measure (default both)")
    decode = suite("decode", "greedy / beam / uncached decoding against Hugging Face generate", cmd_bench_decode, 3,
                   hf=True)
    decode.add_argument("--new-tokens", type=int, default=64, help="tokens generated per sequence (default 64)")
    decode.add_argument("--batch", type=int, default=32, help="sequences decoded together (default 32)")
    suite("lm", "the character LM: training and sampling tokens/s", cmd_bench_lm, 10)
    attn = suite("attention", "time and peak memory of each attention backend, by length", cmd_bench_attention, 3)
    attn.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
                      help="sequence lengths T to measure (default 256 to 32768, doubling)")
    attn.add_argument("--backends", nargs="+", default=["math", "sdpa", "chunked", "local", "sparse", "linear"],
                      help="attention backends to compare (default all; math is the reference)")
    attn.add_argument("--batch", type=int, default=1, help="sequences per call (default 1)")
    attn.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    attn.add_argument("--head-dim", type=int, default=64, help="size of each head (default 64)")
    attn.add_argument("--no-causal", action="store_true", help="no mask (default: causal)")
    attn.add_argument("--memory-budget-gib", type=float, default=12.0,
                      help="skip a size whose predicted memory exceeds this")
    attn.add_argument("--time-limit", type=float, default=60.0, help="skip a size predicted to take longer (s)")
    attn.add_argument("--plot", help="write time and memory vs T (log-log) to this PNG")
    attn.add_argument("--force", action="store_true", help="overwrite an existing --plot file")
    models = suite("models", "recurrent vs Transformer training and decoding tokens/s, by length", cmd_bench_models, 3)
    models.add_argument("--lengths", type=int, nargs="+", default=[10, 25, 50, 100, 200, 400],
                        help="source and target lengths to measure (default 10 to 400)")
    models.add_argument("--models", nargs="+", default=["transformer", "gru_bahdanau", "gru_fixed_context"],
                        help="models to compare (default all three presets' models)")
    models.add_argument("--batch-tokens", type=int, default=4096, help="target tokens per training batch")
    models.add_argument("--decode-batch", type=int, default=16, help="sentences decoded together (default 16)")
    models.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="autocast precision of the training steps (default fp32)")

    data = sub.add_parser("data", help="the standard data sets: fetch them at pinned commits, checksums verified")
    data_sub = data.add_subparsers(dest="action", required=True, parser_class=_Parser)
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

    demo = sub.add_parser("demo", help="train a small Transformer on the built-in SCAN task and show it working")
    demo.add_argument("--out", help="run directory (default: runs/demo-TIMESTAMP)")
    demo.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                      help="override a field of configs/scan.yaml, e.g. --set train.max_steps=300 (repeatable)")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    code = _run(list(sys.argv[1:] if argv is None else argv))
    from attnlab.train.distributed import exit_worker, under_torchrun

    if under_torchrun():
        exit_worker(code)  # the interpreter's shutdown can abort a worker whose gloo threads live on
    return code


def _run(argv: list[str]) -> int:
    """The command's exit status: 0, or an AttnlabError's, after its one line on stderr."""
    try:
        args = make_parser().parse_args(argv)
        args.func(args)
    except KeyboardInterrupt:  # Ctrl-C outside training (which raises Interrupted, saying what it saved)
        if "--debug" in argv:
            raise
        print("\ninterrupted", file=sys.stderr)
        return Interrupted.exit_code
    except BrokenPipeError:  # the reader of stdout has gone (`| head -1`): stop quietly, as `yes | head` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not fail again
        return 128 + signal.SIGPIPE
    except AttnlabError as err:
        if "--debug" in argv:
            raise
        newline = "\n" if isinstance(err, Interrupted) else ""  # after the terminal's ^C and any progress bar
        print(f"{newline}error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
