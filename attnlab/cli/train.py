"""`attnlab train`, `sweep`, `average` and `export`: training runs, resuming them, grids of them, averaging
their checkpoints, exporting one with bf16 or int8 weights."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.cli.common import add_checkpoint_args, stderr_line
from attnlab.errors import CheckpointError, Interrupted, UsageError

if TYPE_CHECKING:
    import torch

    from attnlab.runs.config import RunConfig


def _default_run_dir(stem: str) -> str:
    return str(Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}")


def new_run_dir(out: str | None, stem: str, resume: bool = False) -> Path:
    """The run directory to write: ``out``, or runs/STEM-TIMESTAMP; an existing, non-empty one is
    only taken to resume it, never overwritten."""
    from attnlab.files import is_leftover

    path = Path(out) if out else Path(_default_run_dir(stem))
    if resume:
        if not path.is_dir():
            raise CheckpointError(f"--resume: {path} is not a run directory (give it with --out)")
    elif path.exists() and (not path.is_dir() or any(not (p.is_file() and is_leftover(p)) for p in path.iterdir())):
        raise UsageError(f"{path} already exists; pass --resume to continue that run, or choose another --out")
    return path


def _saved_so_far(out: Path) -> str:
    """What an interrupted training left in ``out``, and how to go on."""
    from attnlab.runs.run_dir import RunDir

    run = RunDir(out)
    steps = run.steps() if out.is_dir() else []
    if steps:
        saved = (
            "a checkpoint of the step it had reached, not evaluated"
            if run.was_interrupted(steps[-1])
            else "its last evaluation's checkpoint"
        )
        return (
            f"interrupted: {out} is saved up to step {steps[-1]} ({saved}); continue with "
            f"`attnlab train --out {out} --resume`"
        )
    return f"interrupted before the first checkpoint; `attnlab train --out {out} --resume` starts it again from step 0"


def _run_config_file(run_dir: str) -> Path:
    from attnlab.runs.run_dir import RunDir

    config = RunDir(run_dir).config
    if not config.is_file():
        raise CheckpointError(f"--resume: {run_dir} is not a run directory (no config.yaml)")
    return config


def cmd_train(args: argparse.Namespace) -> None:
    from attnlab.device import resolve_device
    from attnlab.parallel.distributed import joined_world
    from attnlab.runs.config import RunConfig
    from attnlab.train.run import train_run

    resume = args.resume or args.resume_from is not None
    if args.config is not None:
        cfg = RunConfig.from_file(args.config, args.set or [])
    elif resume and args.out:  # the run's own config, and any --set changes to it
        cfg = RunConfig.from_file(_run_config_file(args.out), args.set or [], of_a_run=True)
    else:
        raise UsageError("train needs a CONFIG file (or --out RUN --resume, to continue a run with its own config)")
    stem = Path(args.config or args.out).stem
    device = resolve_device(cfg.train.device)
    if args.nproc_per_node is not None:
        _launch(args, cfg, device, stem, resume)
        return
    with joined_world(device) as world:  # under torchrun: this rank's place
        cfg.train.check_runs_on(device, world.size if world else 1)
        out = new_run_dir(world.broadcast(args.out or _default_run_dir(stem)) if world else args.out, stem, resume)
        if world:
            world.barrier()  # every rank has checked the directory before rank 0 writes into it
        try:
            summary = train_run(
                cfg, out, resume=resume, world=world, allow_changes=args.allow_changes, resume_from=args.resume_from
            )
        except KeyboardInterrupt:
            raise Interrupted(_saved_so_far(out)) from None
    if world is None or world.is_main:
        print(json.dumps({k: v for k, v in summary.items() if k != "last_eval"} | summary["last_eval"]))
        print(f"run directory: {out}")


def _launch(args: argparse.Namespace, cfg: RunConfig, device: torch.device, stem: str, resume: bool) -> None:
    """`train --nproc-per-node N`: what one process can check of the run is checked here, before any
    process starts (the config, the device, the run directory, the strategy against the model with
    N ranks); then N ranks train it, each told the same run directory."""
    from attnlab.parallel.distributed import World
    from attnlab.parallel.launch import launch
    from attnlab.train.strategy import check_strategy

    ranks = args.nproc_per_node
    if ranks < 1:
        raise UsageError(f"--nproc-per-node must be at least 1 (got {ranks})")
    cfg.train.check_runs_on(device, ranks)
    out = new_run_dir(args.out or _default_run_dir(stem), stem, resume)
    # the strategy against the model's layers, heads and stages: no size of the data changes what it accepts
    check_strategy(
        cfg.train.strategy,
        cfg.model,
        World(rank=0, size=ranks) if ranks > 1 else None,
        cfg.train.tensor_parallel,
        cfg.data.task,
    )
    launch(
        [
            "train",
            *([args.config] if args.config else []),
            "--out",
            str(out),
            *(f"--set={change}" for change in args.set or []),
            *(["--resume"] if resume else []),
            *(["--allow-changes"] if args.allow_changes else []),
            *(["--resume-from", str(args.resume_from)] if args.resume_from is not None else []),
        ],
        args.nproc_per_node,
    )


def cmd_sweep(args: argparse.Namespace) -> None:
    from attnlab.analysis.sweep import run_sweep
    from attnlab.analysis.sweep_spec import SweepSpec
    from attnlab.errors import AttnlabError

    spec = SweepSpec.from_file(args.spec)
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1 (got {args.jobs})")
    out = Path(args.out) if args.out else Path("runs") / Path(args.spec).stem
    outcome = run_sweep(spec, out, args.jobs, dry_run=args.dry_run, report_only=args.report)
    if outcome.table.rows:
        print(outcome.table.markdown(), end="")
        print(f"wrote {', '.join(str(f) for f in outcome.files)}")
    elif not args.dry_run:
        print("no finished runs yet: no table")
    if outcome.failed:
        name, why = next(iter(outcome.failed.items()))
        raise AttnlabError(f"{len(outcome.failed)} of {len(outcome.runs)} runs failed; the first, {name}: {why}")


def cmd_average(args: argparse.Namespace) -> None:
    from attnlab.runs.derived import write_average

    path, steps = write_average(args.run_dir, args.last, args.force)
    if len(steps) < args.last:
        stderr_line(
            f"note: --last {args.last} asked for more checkpoints than the run keeps; averaged all "
            f"{len(steps)} (train.keep_last sets how many a run keeps)"
        )
    print(f"averaged steps {', '.join(map(str, steps))} into {path}")


def cmd_export(args: argparse.Namespace) -> None:
    from attnlab.runs.derived import export_run

    exported, source = export_run(args.run_dir, args.out, args.weights, args.checkpoint, args.force)
    size, original = exported.stat().st_size, source.stat().st_size
    print(
        f"exported {source} with {args.weights} weights to {exported}: {size / 2**20:.1f} MiB, "
        f"{size / original:.2f} x the checkpoint's {original / 2**20:.1f} MiB"
    )
    print(f"run directory: {args.out}")


def cmd_import_hf(args: argparse.Namespace) -> None:
    from attnlab.interop import import_hf

    imported = import_hf(args.folder, args.out)
    for line in imported.report.lines("import-hf"):
        print(line)
    task = imported.data.task
    print(
        f"a run of data.task '{task.name}'; its commands: {', '.join(task.commands)}, and train.init_from to "
        f"fine-tune it"
    )
    print(f"run directory: {args.out}")


def cmd_export_hf(args: argparse.Namespace) -> None:
    from attnlab.interop import export_hf

    converter, out = export_hf(args.run_dir, args.out, args.checkpoint)
    files = ", ".join(sorted(path.name for path in out.iterdir()))
    print(f"exported {args.run_dir} as a Hugging Face {converter.model_type} folder ({files}): {out}")


def cmd_export_ct2(args: argparse.Namespace) -> None:
    from attnlab.interop.ct2 import export_ct2

    engine, out = export_ct2(args.run_dir, args.out, args.checkpoint, args.quantization)
    print(f"exported {args.run_dir} as a CTranslate2 model ({args.quantization or 'weights as trained'}): {out}")
    print(f"load it with ctranslate2.{engine}({str(out)!r})")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `train, sweep, average, export, import-hf, export-hf and export-ct2` to the command line."""
    train = sub.add_parser("train", help="train a model from a config file")
    train.add_argument(
        "config",
        nargs="?",
        help="YAML or JSON config with model, data and train sections (with --resume: the run's own "
        "config.yaml when left out)",
    )
    train.add_argument("--out", help="run directory (default: runs/CONFIG-TIMESTAMP)")
    train.add_argument(
        "--set",
        action="append",
        metavar="SECTION.FIELD=VALUE",
        help="override one config field, e.g. --set train.max_steps=200 (repeatable)",
    )
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its newest checkpoint, with the run's own config",
    )
    train.add_argument(
        "--resume-from",
        type=int,
        metavar="STEP",
        help="as --resume, from the checkpoint of STEP rather than the newest (one that is damaged): "
        "the newer checkpoints are moved into RUN/checkpoints/set-aside-TIME/, not deleted",
    )
    train.add_argument(
        "--nproc-per-node",
        type=int,
        metavar="N",
        help="train in N processes on this machine (DDP, or train.strategy fsdp/tp/pp/fsdp+tp), started "
        "as torchrun starts them once the config is checked; a process's failure is one line and "
        "its exit code",
    )
    train.add_argument(
        "--allow-changes",
        action="store_true",
        help="with --resume: train on with train settings that differ from the run's (from CONFIG "
        "or --set); they are recorded in RUN/config_changes.jsonl. Model and data never change",
    )
    train.set_defaults(func=cmd_train)

    sweep = sub.add_parser(
        "sweep",
        help="train a grid of config overrides x seeds and tabulate the results",
        description="Train every cell of the spec's grid (--set overrides of a base config) with "
        "every seed, one after another or --jobs at a time, each in its own run "
        "directory OUT/CELL/seedK; runs that finished are kept, stopped ones resumed. "
        "Writes OUT/results.md and results.csv (mean and standard deviation over seeds "
        "per cell), runs.csv and results.png. The spec format: attnlab/analysis/sweep.py.",
    )
    sweep.add_argument("spec", help="the sweep spec (YAML, one section 'sweep')")
    sweep.add_argument("--out", help="the sweep's directory (default: runs/SPEC)")
    sweep.add_argument("--jobs", type=int, help="runs at a time (default: the spec's jobs, else 1)")
    sweep.add_argument("--dry-run", action="store_true", help="list the runs and what each needs; train nothing")
    sweep.add_argument("--report", action="store_true", help="write the table of the finished runs; train nothing")
    sweep.set_defaults(func=cmd_sweep)

    average = sub.add_parser("average", help="average the newest checkpoints of a run (as the paper does)")
    average.add_argument("run_dir", help="a run directory written by `attnlab train`")
    average.add_argument("--last", type=int, default=5, help="how many of the newest checkpoints (default 5)")
    average.add_argument("--force", action="store_true", help="replace the run's existing average")
    average.set_defaults(func=cmd_average)

    export = sub.add_parser(
        "export",
        help="a run's checkpoint with bf16 or int8 weights, as a run for decoding",
        description="Write a new run directory OUT for decoding: the run's config and tokenizers, "
        "and the checkpoint's weights in bfloat16, or with int8 linear layers but the "
        "output projection (int8 values and a float32 scale per output channel; the "
        "rest float32), in safetensors with checksums. translate, generate, evaluate, "
        "score, inspect and serve read it as any run; int8 runs on the CPU only.",
    )
    add_checkpoint_args(export)
    export.add_argument("--weights", required=True, choices=("bf16", "int8"), help="the weights to store")
    export.add_argument("--out", required=True, help="the run directory to write")
    export.add_argument("--force", action="store_true", help="replace an existing OUT")
    export.set_defaults(func=cmd_export)

    hf = sub.add_parser(
        "import-hf",
        help="make a run directory of a local Hugging Face folder (BERT, GPT-2, Marian, ViT)",
        description="Read config.json, model.safetensors and the tokenizer's files of a Hugging Face "
        "folder (never the network, never a pickled pytorch_model.bin) and write a run: "
        "model_type 'bert' -> encoder_only (a masked-LM or encoder run), 'gpt2' -> "
        "decoder_lm (a language-model run: generate, score, inspect, prune, serve), 'marian' "
        "-> encoder_decoder (a translation run, with its source.spm and target.spm: translate, "
        "inspect, prune, serve), 'vit' -> vit "
        "(an image_classification run, or an image_encoder run for ViTModel; "
        "preprocessor_config.json gives its pixel statistics).",
    )
    hf.add_argument("folder", help="the Hugging Face model folder")
    hf.add_argument("--out", required=True, help="the run directory to write (must not exist)")
    hf.set_defaults(func=cmd_import_hf)

    export_hf = sub.add_parser(
        "export-hf",
        help="write a run as a Hugging Face folder (decoder_lm -> GPT-2, "
        "encoder_only -> BERT, encoder_decoder -> Marian, vit -> ViT)",
        description="Write config.json, model.safetensors and the tokenizer's files of a run's "
        "checkpoint so that transformers' AutoModel...from_pretrained loads it: "
        "decoder_lm runs whose options GPT-2 has, encoder_only runs whose options "
        "BERT has (BertForMaskedLM for a masked-LM run, else BertModel), "
        "encoder_decoder runs whose options Marian has (MarianMTModel, with "
        "source.spm and target.spm), vit runs whose options ViT has "
        "(ViTForImageClassification for an image_classification run with "
        "head: linear, ViTModel for an image_encoder run, with "
        "preprocessor_config.json); options without a counterpart are refused, "
        "named in one line.",
    )
    add_checkpoint_args(export_hf)
    export_hf.add_argument("--out", required=True, help="the folder to write (must not exist, or be empty)")
    export_hf.set_defaults(func=cmd_export_hf)

    ct2 = sub.add_parser(
        "export-ct2",
        help="write a run as a CTranslate2 model (decoder_lm -> Generator, encoder_decoder -> Translator)",
        description="Write a CTranslate2 model folder (config.json, model.bin, the vocabulary) of a "
        "run's checkpoint, through export-hf's Hugging Face folder and CTranslate2's own "
        "converter: decoder_lm runs whose options GPT-2 has (ctranslate2.Generator), "
        "encoder_decoder runs whose options Marian has (ctranslate2.Translator: its "
        "source tokens end with '</s>', as the run's do); other runs and options are "
        "refused, named in one line. Needs the ct2 extra (pip install 'attnlab[ct2]').",
    )
    add_checkpoint_args(ct2)
    ct2.add_argument("--out", required=True, help="the folder to write (must not exist, or be empty)")
    ct2.add_argument(
        "--quantization",
        metavar="TYPE",
        help="store the weights as CTranslate2's TYPE: float32, int8, int8_float32, int16, float16 or "
        "bfloat16 (default: as trained); CTranslate2 can also quantise when loading (compute_type)",
    )
    ct2.set_defaults(func=cmd_export_ct2)
