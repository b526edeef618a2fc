"""`attnlab info`: parameter counts, FLOPs and memory of a model config, a training config or a run."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from attnlab.errors import CheckpointError, UsageError

if TYPE_CHECKING:
    from attnlab.analysis.parallel_budget import MemoryRow
    from attnlab.models.family import FamilyConfig
    from attnlab.models.shape import DataShape
    from attnlab.runs.config import RunConfig
    from attnlab.runs.run_dir import RunDir
    from attnlab.tasks import TaskConfig

SERIES_SIZES = (("channels", "n_channels"), ("input", "input_length"), ("horizon", "horizon"))  # forecasters


def _describe_model(cfg: FamilyConfig, shape: DataShape, vocab: str | None) -> str:
    """One line: the architecture and the sizes that matter for it (the vocabulary for a model of tokens)."""
    from attnlab.models import stack_of

    can = cfg.capabilities
    stacks = [
        str(getattr(cfg, f"{stack}_layers"))
        for stack, has in (("encoder", can.encoder), ("decoder", can.decoder))
        if has and hasattr(cfg, f"{stack}_layers")
    ]  # a plug-in family may have no stack of layers
    stack = stack_of(cfg)
    if stack is not None:
        sizes: list[tuple[str, int | str | None]] = [
            ("d_model", stack.d_model),
            ("heads", stack.n_heads),
            ("layers", "+".join(stacks) or stack.n_layers),
            ("d_ff", stack.d_ff),
        ]
    else:  # a recurrent or convolutional model: its sizes as its section writes them (model.d_model)
        written = cfg.to_dict()
        sizes = [
            ("hidden size", written.get("d_model")),
            ("layers", "+".join(stacks) or written.get("n_layers")),
        ]
    sizes.append(("vocab", vocab))
    sizes += [(name, getattr(shape, field)) for name, field in SERIES_SIZES]
    return ", ".join(
        [cfg.arch]
        + [
            f"{value} {name}" if name in ("heads", "layers") else f"{name} {value}"
            for name, value in sizes
            if value is not None
        ]
    )


def _info_model_config(
    args: argparse.Namespace,
) -> tuple[FamilyConfig, DataShape | None, Callable[[int], DataShape] | None, TaskConfig | None, RunDir | None]:
    """The model ``info`` counts: (its family's config, the data's sizes, None) when its vocabulary is
    known, else (its config, None, a function from vocabulary size to the sizes). The config is a
    model config (its model section and the sizes of its ``shape`` section), a training config (its
    model section; the sizes its task plans, the vocabulary from --vocab-size or from a built-in
    task's tokenizer) or a run directory (its config.yaml and shape.json), with --set overrides. Also
    returned: the data section (None for a model config without one) and the run directory (None for
    a config), which the exporters ask."""
    from attnlab.config import apply_overrides, read_config_file
    from attnlab.errors import ConfigError
    from attnlab.models import Inputs, model_config
    from attnlab.models.family import DEFAULT_ARCH
    from attnlab.models.shape import DataShape
    from attnlab.runs.config import RunConfig, override_fields
    from attnlab.runs.data import prepared_shape
    from attnlab.runs.migration import migrated_data, migrated_model, refuse_moved, refuse_moved_data
    from attnlab.runs.run_dir import RunDir
    from attnlab.tasks import task_config

    path = Path(args.config)
    of_a_run = path.is_dir()
    if of_a_run:
        path = RunDir(path).config
        if not path.is_file():
            raise CheckpointError(f"{args.config} is a directory but not a run directory (no config.yaml)")
    sections = read_config_file(path)
    model = sections.get("model")
    for expr in args.set or []:  # an old flat spelling: the one line that names the new one
        key = expr.partition("=")[0].strip()
        if key.startswith("model."):
            arch = model.get("arch", DEFAULT_ARCH) if isinstance(model, dict) else DEFAULT_ARCH
            refuse_moved(arch, [key.removeprefix("model.")], f"--set {expr!r}: ")
        if key.startswith("data.") and not of_a_run:
            refuse_moved_data(sections.get("data"), [key.removeprefix("data.")], f"--set {expr!r}: ")
    apply_overrides(sections, args.set or [], override_fields)
    where = " ".join([str(path), *(f"--set {expr}" for expr in args.set or [])])
    model = sections.get("model")
    vocab = {} if args.vocab_size is None else {"vocab_size": args.vocab_size}
    cfg: FamilyConfig | RunConfig  # the model's config, or a training config's whole
    if isinstance(model, dict) and (of_a_run or "data" not in sections):  # a run's complete one, or a model config
        try:
            if of_a_run:
                shape = RunDir(args.config).read_shape()
                return (
                    model_config(migrated_model(model)),
                    dataclasses.replace(shape, **vocab),
                    None,
                    task_config(migrated_data(sections["data"])),
                    RunDir(args.config),
                )
            refuse_moved(model.get("arch", DEFAULT_ARCH), model)
            shape = DataShape.from_dict((sections.get("shape") or {}) | vocab, "shape")
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
        try:
            cfg = model_config(model)
            cfg.check_shape(shape)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
        if shape.vocab_size is None and cfg.capabilities.inputs == Inputs.TOKENS:
            raise ConfigError(
                f"{where}: a model config without a data section gives its data's sizes as a 'shape' "
                f"section (shape: {{vocab_size: V}}), or --vocab-size V"
            )
        return cfg, shape, None, None, None
    cfg = RunConfig.from_sections(sections, where)
    if args.vocab_size is not None:
        return cfg.model, cfg.planned_shape(args.vocab_size), None, cfg.data, None
    if cfg.data.in_memory or cfg.train.init_from is not None:  # generated, or the tokenizer is the source run's:
        return cfg.model, prepared_shape(cfg), None, cfg.data, None  # no tokenizer to fit
    if not cfg.data.task.tokenizers:  # images, graphs, series: no vocabulary
        return cfg.model, cfg.planned_shape(), None, cfg.data, None
    return cfg.model, None, cfg.planned_shape, cfg.data, None


def _exportability(cfg: FamilyConfig, data: TaskConfig | None, run: RunDir | None) -> dict[str, str | None] | None:
    """Each exporter's answer for the run (or, for a config, the run it trains): export-hf's
    architectures by model_type, then export-ct2; None where it exports, else the exporter's own
    one-line reason. None for a model config without a data section (the tokenizer and the task
    decide too)."""
    if data is None:
        return None
    from attnlab.interop import EXPORTERS, ct2

    answers = {
        f"export-hf {converter.model_type}": converter.refusal(cfg, data, run)
        for converter in sorted(EXPORTERS.values(), key=lambda converter: converter.model_type)
    }
    refused = ct2.export_refusals(cfg, data, run)
    answers["export-ct2"] = "; ".join(refused) if refused else ct2.missing_extra()
    return answers


def format_exportability(answers: dict[str, str | None] | None) -> str:
    """The table of :func:`_exportability`'s answers (one line where the data section is missing)."""
    if answers is None:
        return (
            "exportable: the data section decides too (tokenizer, task); give a training config or a run "
            "to see what export-hf and export-ct2 say"
        )
    width = max(map(len, answers))
    return "\n".join(
        ["exportable:"]
        + [f"  {name:<{width}}  {'yes' if why is None else 'no: ' + why}" for name, why in answers.items()]
    )


def cmd_info(args: argparse.Namespace) -> None:
    import torch

    from attnlab.analysis.budget import (
        budget_report,
        format_budget_report,
        format_parameter_report,
        format_sound_report,
        parameter_report,
        sound_report,
    )
    from attnlab.models import Inputs, build_model
    from attnlab.models.audio import WAVEFORMS

    if min(args.seq_len, args.batch) < 1 or (args.src_len is not None and args.src_len < 1):
        raise UsageError("--seq-len, --src-len and --batch must be at least 1")
    if args.vocab_size is not None and args.vocab_size < 1:
        raise UsageError(f"--vocab-size must be at least 1 (got {args.vocab_size})")
    cfg, shape, with_vocab, data, run = _info_model_config(args)

    def count(sizes: DataShape) -> dict[str, Any]:
        with torch.device("meta"):  # shapes only: no memory for the weights, no time to initialise them
            return parameter_report(build_model(cfg, sizes))

    if shape is None:  # a training config whose vocabulary comes from its data files: parameters = a + b V
        assert with_vocab is not None  # given exactly where shape is not
        if args.memory or args.flops:
            raise UsageError(
                f"{args.config}: the vocabulary comes from the data; give --vocab-size V for --memory and --flops"
            )
        small, large = (count(with_vocab(v))["params_total"] for v in (1000, 2000))
        per_entry = (large - small) // 1000
        fixed = small - 1000 * per_entry
        export = _exportability(cfg, data, run)  # the exporters' rules do not depend on the vocabulary's size
        if args.json:
            print(
                json.dumps(
                    {
                        "config": str(args.config),
                        "arch": cfg.arch,
                        "vocab_size": None,
                        "params_without_vocab": fixed,
                        "params_per_vocab_entry": per_entry,
                        **({"export": export} if export is not None else {}),
                    }
                )
            )
            return
        print(f"{args.config}: {_describe_model(cfg, with_vocab(1000), 'V')}")
        print(
            f"parameters: {fixed:,} + {per_entry:,} x V, V the vocabulary size, which the tokenizer sets from "
            f"the data (--vocab-size V counts it exactly)"
        )
        print()
        print(format_exportability(export))
        return
    report = {"config": str(args.config), "arch": cfg.arch, **count(shape)}
    export = _exportability(cfg, data, run)
    if export is not None:  # (a model config's report stays what it was: tests/golden/ pins it)
        report["export"] = export
    budget = None
    if (args.memory or args.flops) and cfg.capabilities.inputs != Inputs.TOKENS:
        raise UsageError(
            f"--memory and --flops measure models of token sequences; arch '{cfg.arch}' reads "
            f"{cfg.capabilities.inputs}; without them, info counts its parameters"
        )
    if args.memory or args.flops:  # measured on the meta device
        try:
            budget = budget_report(cfg, shape, args.seq_len, args.batch, args.src_len)
        except ValueError as err:
            raise UsageError(str(err)) from None
        report["budget"] = {
            k: v
            for k, v in budget.items()
            if (args.flops or k != "flops") and (args.memory or not k.endswith("_memory"))
        }
    if args.parallel is not None:
        report["parallel_memory"] = _parallel_memory(cfg, shape, args)
    if cfg.capabilities.inputs == WAVEFORMS:
        report["audio"] = sound_report(cfg, shape)
    if args.json:
        print(json.dumps(report))
        return
    vocab = f"{shape.vocab_size:,}" if shape.vocab_size is not None else None
    print(f"{args.config}: {_describe_model(cfg, shape, vocab)}")
    print(format_parameter_report(report))
    print()
    print(format_exportability(export))
    if "audio" in report:
        print()
        print(format_sound_report(report["audio"]))
    if budget is not None:
        print()
        print(format_budget_report(report["budget"]))
    if args.parallel is not None:
        from attnlab.analysis.parallel_budget import format_parallel_memory

        print()
        print(
            format_parallel_memory(report["parallel_memory"], args.parallel, args.micro_batches, args.tensor_parallel)
        )


def _parallel_memory(cfg: FamilyConfig, shape: DataShape, args: argparse.Namespace) -> dict[str, MemoryRow]:
    """Per-rank training memory of each train.strategy on --parallel N ranks (meta device)."""
    from attnlab.analysis.parallel_budget import parallel_memory
    from attnlab.runs.train_config import TrainConfig

    if args.parallel < 2 or args.micro_batches < 1:
        raise UsageError(
            f"--parallel needs at least 2 ranks and --micro-batches at least 1 (got {args.parallel}, "
            f"{args.micro_batches})"
        )
    if args.tensor_parallel is None:  # train.tensor_parallel's default; a row says so where it cannot apply
        args.tensor_parallel = TrainConfig.tensor_parallel
    elif args.tensor_parallel < 1 or args.parallel % args.tensor_parallel:
        raise UsageError(f"--tensor-parallel ({args.tensor_parallel}) must divide --parallel ({args.parallel})")
    if not cfg.capabilities.attention_weights or cfg.capabilities.inputs != "tokens":
        raise UsageError(f"--parallel measures Transformer models of token sequences, not arch '{cfg.arch}'")
    return parallel_memory(
        cfg,
        shape,
        args.seq_len,
        args.batch,
        args.parallel,
        args.micro_batches,
        args.src_len,
        tensor_parallel=args.tensor_parallel,
    )


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `info` to the command line."""
    info = sub.add_parser("info", help="parameter counts of a model config")
    info.add_argument("config", help="a model or training config (YAML or JSON), or a run directory")
    info.add_argument(
        "--set",
        action="append",
        metavar="SECTION.FIELD=VALUE",
        help="override one config field, e.g. --set model.stack.n_layers=4 (repeatable)",
    )
    info.add_argument(
        "--vocab-size",
        type=int,
        metavar="V",
        help="count with this vocabulary size (a training config's tokenizer otherwise sets it from the data)",
    )
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.add_argument("--memory", action="store_true", help="training and inference memory (meta device)")
    info.add_argument("--flops", action="store_true", help="FLOPs split into attention, FFN and output")
    info.add_argument("--seq-len", type=int, default=512, help="tokens per sequence for --memory/--flops")
    info.add_argument("--src-len", type=int, help="source tokens (encoder-decoder; default --seq-len)")
    info.add_argument("--batch", type=int, default=32, help="sequences per batch for --memory/--flops")
    info.add_argument(
        "--parallel",
        type=int,
        metavar="N",
        help="training memory per rank of each train.strategy on N ranks (--batch: the global batch)",
    )
    info.add_argument("--micro-batches", type=int, default=4, help="pipeline micro-batches for --parallel")
    info.add_argument(
        "--tensor-parallel",
        type=int,
        metavar="T",
        help="fsdp+tp's tensor-parallel group size for --parallel (dp = N / T; default: train.tensor_parallel's, 2)",
    )
    info.set_defaults(func=cmd_info)
