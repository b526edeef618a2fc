"""What the commands share: reading input and writing output safely, loading a run for a command
that needs certain capabilities, the decoding limits, and the one error path of argparse."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from attnlab.errors import UsageError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from attnlab.data.tokenizers import Tokenizer
    from attnlab.decode.spec import Beam, Greedy, MaskPredict, Sample, Search
    from attnlab.models.family import FamilyConfig
    from attnlab.tasks import Task

CONFIGS = Path(__file__).resolve().parents[2] / "configs"  # the presets of a source checkout


def check_new_file(path: str | None, force: bool, option: str) -> None:
    """Refuse, before any work is done, an output ``path`` that is a directory, or that exists
    when ``force`` is not given."""
    if path is None:
        return
    if Path(path).is_dir():
        raise UsageError(f"{option} {path} is a directory; give a file name")
    if Path(path).exists() and not force:
        raise UsageError(f"{path} already exists; pass --force to overwrite it")


def write_output(path: str | None, text: str, force: bool) -> None:
    """To --output FILE (atomically; an existing file only with --force), or to standard output."""
    from attnlab.files import atomic_write_text

    if path is None:
        sys.stdout.write(text)
        return
    check_new_file(path, force, "--output")
    atomic_write_text(path, text)


def nbest_lines(names: list[str], results: list[list[tuple[str, float | None]]], nbest: int) -> str:
    """`NAME TAB output` per input, or with --nbest K (> 1), K lines `NAME TAB output TAB score` each."""
    if nbest == 1:
        return "".join(f"{name}\t{outputs[0][0]}\n" for name, outputs in zip(names, results))
    return "".join(
        f"{name}\t{output}\t{score:.4f}\n" for name, outputs in zip(names, results) for output, score in outputs
    )


def add_nbest_output_args(p: argparse.ArgumentParser, inputs: str, output: str) -> None:
    """--nbest, --max-len, --batch-size, --output and --force of a command that decodes ``inputs`` (files)
    into an ``output`` each: `caption`'s, `transcribe`'s."""
    p.add_argument(
        "--nbest",
        type=int,
        default=1,
        help=f"print the K best per {inputs}, a line each: {inputs} TAB {output} TAB score",
    )
    p.add_argument("--max-len", type=int, help=f"most {output} tokens (default: the model's max_len - 1)")
    p.add_argument("--batch-size", type=int, default=64, help=f"{inputs}s per batch (default 64)")
    p.add_argument("--output", help="output file (default: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --output")


def stderr_line(line: str) -> None:
    """A progress or log line, on stderr at once."""
    print(line, file=sys.stderr, flush=True)


# What a command needs of a model, as capabilities: translation reads a source and decodes a target;
# generation samples from a prompt alone, step by step with a cache.
TRANSLATES = {"encoder": True, "decoder": True}
GENERATES = {"encoder": False, "decoder": True, "incremental_decoding": True}
CAPTIONS = {"encoder": True, "decoder": True, "inputs": "images"}  # an image in, a sentence out


def check_task_serves(args: argparse.Namespace) -> Task[Any, Any]:
    """The run's task; refused, in one line, when it does not serve ``args.command`` (its ``commands``)."""
    from attnlab.runs.run_dir import RunDir
    from attnlab.tasks import TASKS

    task = RunDir(args.run_dir).read_config()[1].task
    if args.command not in task.commands:
        serving = [name for name, t in TASKS.items() if args.command in t.commands]
        raise UsageError(
            f"{args.run_dir} is a run of data.task '{task.name}'; `attnlab {args.command}` needs data.task "
            f"{' or '.join(map(repr, serving))} (this run's commands: {', '.join(task.commands)})"
        )
    return task


def add_device_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        default="auto",
        help="where the model runs: auto (the GPU when there is one; default), cpu, cuda or cuda:N",
    )


def add_checkpoint_args(p: argparse.ArgumentParser) -> None:
    """The run directory and its checkpoint."""
    p.add_argument("run_dir", help="a run directory written by `attnlab train`")
    p.add_argument("--checkpoint", default="best", help="best (default), last, average, or a step number")


def add_run_dir_args(p: argparse.ArgumentParser) -> None:
    """The run directory, its checkpoint and the device: what every command that uses a run takes."""
    add_checkpoint_args(p)
    add_device_option(p)


def add_kv_cache_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kv-cache",
        default="auto",
        metavar="auto|dynamic|static|graph|compiled",
        help="the cache of keys and values: auto (graph on a GPU where the model allows, else dynamic), "
        "dynamic, static (preallocated), graph (static, the step replayed as a CUDA graph) or compiled "
        "(static, the step compiled by torch.compile: faster at batch 1 on a CPU after a compilation "
        "of about a minute); the same output each way",
    )


def add_weights_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--weights",
        choices=("fp32", "bf16", "int8"),
        help="decode with the weights as trained (fp32), in bfloat16, or with int8 linear layers but "
        "the output projection (dynamic per-channel quantisation, CPU only); default: the run's own "
        "(fp32, or those of a run written by `attnlab export`)",
    )


def add_search_args(p: argparse.ArgumentParser, weights: bool = True) -> None:
    """Beam search's options, the cache and (``weights``) the weights: translate's, evaluate's and caption's."""
    p.add_argument("--beam", type=int, default=4, help="beam size; 1 = greedy (default 4, as the paper)")
    p.add_argument("--lenpen", type=float, default=0.6, help="GNMT length penalty alpha (default 0.6)")
    p.add_argument("--no-cache", action="store_true", help="recompute every prefix (same output, slower)")
    add_kv_cache_option(p)
    if weights:
        add_weights_option(p)


def device_of(args: argparse.Namespace) -> torch.device:
    """The torch.device of ``--device``, refused in one line when it is not on this machine."""
    from attnlab.device import resolve_device

    return resolve_device(args.device, "--device")


def load_run_for(
    args: argparse.Namespace, needs: Mapping[str, object]
) -> tuple[nn.Module, dict[str, Tokenizer | None], FamilyConfig]:
    """The run's model (on ``--device``), tokenizers and model config, after checking that the run's
    task serves the command, that its family has the capabilities ``needs``, and the decoding
    options against it."""
    from attnlab.models import FAMILIES
    from attnlab.runs.checkpoint import load_run

    device = device_of(args)  # the command line first: a GPU that is not there is refused before any reading
    check_task_serves(args)
    model, tokenizers, cfg = load_run(args.run_dir, args.checkpoint, device)
    if any(getattr(cfg.capabilities, name) != value for name, value in needs.items()):
        fits = [
            name
            for name, family in FAMILIES.items()
            if all(getattr(family.capabilities, k) == v for k, v in needs.items())
        ]
        raise UsageError(
            f"{args.run_dir} holds a model of arch '{cfg.arch}'; `attnlab {args.command}` needs "
            f"{' or '.join(map(repr, fits))}"
        )
    limit = cfg.longest_sequence  # None: a family with no such limit
    if limit is not None and (getattr(args, "max_len", None) or 0) > limit:
        raise UsageError(f"--max-len {args.max_len} is beyond the model's max_len ({limit} positions)")
    return with_weights_of(args, model), tokenizers, cfg


def with_weights_of(args: argparse.Namespace, model: nn.Module) -> nn.Module:
    """The model with the weights of ``--weights`` (fp32, bf16 or int8), where the command has the option
    and it is given; else as the run holds them."""
    from attnlab.decode.weights import with_weights

    if getattr(args, "weights", None) is None:
        return model
    try:
        return with_weights(model, args.weights)
    except ValueError as err:
        raise UsageError(f"--weights {args.weights}: {err}") from None


def check_kv_cache(args: argparse.Namespace, model: nn.Module) -> None:
    """--kv-cache (one of the searches' caches, as the search spec checks): one that ``model`` can use on its
    device; else one line."""
    from attnlab.decode.session import cache_kind

    try:
        cache_kind(args.kv_cache, model, next(model.parameters()).device)
    except ValueError as err:
        raise UsageError(f"--kv-cache {args.kv_cache}: {err}") from None


def add_mask_predict_args(p: argparse.ArgumentParser) -> None:
    """Mask-predict's options (runs whose model reads masked targets); --beam's default then depends on the run."""
    p.add_argument(
        "--iterations",
        type=int,
        metavar="T",
        help="mask-predict runs (arch cmlm): its passes, re-masking the least sure tokens (default 10, as the paper)",
    )
    p.add_argument(
        "--length-beam",
        type=int,
        metavar="L",
        help="mask-predict runs (arch cmlm): the L most likely target lengths decoded per sentence "
        "(default 5, as the paper)",
    )
    p.set_defaults(beam=None)  # None: not given (4 for a left-to-right run; refused for a mask-predict run)


def search_of(args: argparse.Namespace) -> Search:
    """The search (decode/spec.py) that the decoding options of ``args`` ask for, checked: for
    `generate` (--temperature, ...) sampling; else greedy (--beam 1 and one output each) or beam
    search, or, for a command with mask-predict's options (:func:`add_mask_predict_args`) and a run
    whose model reads masked targets, mask-predict. With --draft, speculative decoding of greedy's or
    sampling's output, its draft (``draft``) left for the command to load. One line for each refusal."""
    from attnlab.decode.spec import Speculative

    search: Sample | Greedy | Beam
    if "temperature" in vars(args):
        search = _sample_of(args)
        return search if args.draft is None else Speculative(k=args.speculate, max_len=search.max_len, sampling=search)
    shared = {"batch_size": getattr(args, "batch_size", 64), "use_cache": not args.no_cache, "kv_cache": args.kv_cache}
    masked_arch = _masked_arch(args) if "iterations" in vars(args) else None
    if masked_arch is not None:
        return _mask_predict_of(args, masked_arch, shared)
    search = _left_to_right_of(args, shared)
    if getattr(args, "draft", None) is None:
        return search
    if args.beam != 1 or args.nbest != 1 or args.min_len or args.speculate < 1:
        raise UsageError("--draft decodes greedily: give --beam 1, no --nbest or --min-len, and --speculate >= 1")
    return Speculative(k=args.speculate, max_len=search.max_len, batch_size=search.batch_size)


def _left_to_right_of(args: argparse.Namespace, shared: dict[str, Any]) -> Greedy | Beam:
    """Greedy search for --beam 1 and one output each, else beam search."""
    from attnlab.decode.spec import Beam, Greedy

    beam, nbest = 4 if args.beam is None else args.beam, getattr(args, "nbest", 1)
    limits: dict[str, Any] = {"max_len": getattr(args, "max_len", None), "min_len": getattr(args, "min_len", 0)}
    if beam == 1 and nbest == 1:
        return Greedy(**limits, **shared)
    return Beam(width=beam, lenpen=args.lenpen, nbest=nbest, **limits, **shared)


def _sample_of(args: argparse.Namespace) -> Sample:
    """`generate`'s sampling: --temperature, --top-k (0: no limit), --top-p, --max-new-tokens, and
    --seed (default: a new one, which the command prints)."""
    import secrets

    from attnlab.decode.spec import Sample

    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    return Sample(
        max_len=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=seed,
        stop_at_eos=False,
        kv_cache=args.kv_cache,
    )


def _masked_arch(args: argparse.Namespace) -> str | None:
    """The run's arch where its model reads a target with masked tokens (its family's ``inputs``);
    None for any other run, whose --iterations and --length-beam are refused in one line."""
    from attnlab.models import FAMILIES, Inputs
    from attnlab.runs.run_dir import RunDir

    cfg = RunDir(args.run_dir).read_config()[0]
    if cfg.capabilities.inputs is Inputs.MASKED_TOKENS:
        return cfg.arch
    masked = [name for name, family in FAMILIES.items() if family.capabilities.inputs is Inputs.MASKED_TOKENS]
    for option, value in (("--iterations", args.iterations), ("--length-beam", args.length_beam)):
        if value is not None:
            raise UsageError(
                f"{option} is mask-predict's, for runs of arch {' or '.join(map(repr, masked))}; "
                f"{args.run_dir} holds arch '{cfg.arch}', decoded left to right (--beam)"
            )
    return None


def _mask_predict_of(args: argparse.Namespace, arch: str, shared: dict[str, Any]) -> MaskPredict:
    """Mask-predict's settings from --iterations and --length-beam; left-to-right options refused in one line."""
    from attnlab.decode.spec import MaskPredict

    left_to_right = {
        "--beam": args.beam is not None,
        "--nbest": getattr(args, "nbest", 1) != 1,
        "--draft": getattr(args, "draft", None) is not None,
        "--min-len": bool(getattr(args, "min_len", 0)),
        "--max-len": getattr(args, "max_len", None) is not None,
        "--no-cache": args.no_cache,
        "--kv-cache": args.kv_cache != "auto",
        "--oracle-length": getattr(args, "oracle_length", False),
    }
    given = [option for option, is_given in left_to_right.items() if is_given]
    if given:
        raise UsageError(
            f"{given[0]} is for left-to-right search; {args.run_dir} holds arch '{arch}', decoded by "
            f"mask-predict: give --iterations and --length-beam"
        )
    return MaskPredict(
        iterations=10 if args.iterations is None else args.iterations,
        length_beam=5 if args.length_beam is None else args.length_beam,
        **shared,
    )


def check_beam(args: argparse.Namespace) -> None:
    """--beam of a command that takes no other search option (inspect's), checked as beam search checks it."""
    from attnlab.decode.spec import Beam

    Beam(width=args.beam)


class Parser(argparse.ArgumentParser):
    """argparse that reports usage errors through the one error path (exit code 2, one line)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        from attnlab.config import did_you_mean
        from attnlab.errors import UsageError

        choice = re.fullmatch(r"argument .*: invalid choice: '(.*)' \(choose from (.*)\)", message)
        if choice:  # a mistyped command or choice: name the closest one
            message += did_you_mean(choice[1], re.findall(r"'([^']*)'", choice[2]))
        raise UsageError(f"{self.prog}: {message}")


def emit(record: dict[str, Any], as_json: bool, line: str) -> None:
    print(json.dumps(record) if as_json else line, flush=True)
