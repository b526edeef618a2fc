"""Shared test helpers."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import subprocess
import sys
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab import FAMILIES, build_model, model_config
from attnlab.data.tokenizers import EOS
from attnlab.models import FamilyConfig, StackConfig
from attnlab.models.shape import SIZES, DataShape

# The command-line program and torchrun, as commands (argv prefixes) of this interpreter: they work
# in a plain checkout where no console script is installed (tests/conftest.py puts the repository
# root on PYTHONPATH for every subprocess). Use as [*ATTNLAB, "train", ...].
ATTNLAB = (sys.executable, "-m", "attnlab.cli")
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")


def assert_sgd_step_close(
    weights: dict[str, Tensor],
    expected: dict[str, Tensor],
    grads: dict[str, Tensor],
    lr: float,
    atol: float,
    rtol: float,
) -> None:
    """Weights after the SGD step w - lr * g from the same w, against ``expected``, where the two
    gradients may differ by ``atol + rtol * |g|``: that times lr, plus the rounding of lr * g and of
    the difference, at most one float32 eps relative each on either side (eps is twice the unit
    roundoff, which also covers the second-order terms)."""
    eps = torch.finfo(torch.float32).eps
    for name, w in expected.items():
        g = grads[name].abs()
        bound = lr * (atol + rtol * g) + eps * (w.abs() + lr * g)
        excess = ((weights[name] - w).abs() - bound).max().item()
        assert excess <= 0, f"{name}: the weights after the step differ by {excess:.3g} more than float32 allows"


def why(done: subprocess.CompletedProcess) -> str:
    """What a failed command's stderr says, for an assertion's message: its end, or, where a process
    crashed (the tests' torchrun jobs run with PYTHONFAULTHANDLER), the crash's Python stacks, which
    torchrun's own report of the failure would push out of the end."""
    crash = done.stderr.find("Fatal Python error")
    return done.stderr[crash : crash + 6000] if crash >= 0 else done.stderr[-3000:]


def assert_only_torchruns_traceback(stderr: str) -> None:
    """A failed torchrun job: its launcher reports the failed workers with a traceback of its own,
    ending in ChildFailedError; the workers, attnlab's processes, print none."""
    tracebacks = stderr.count("Traceback (most recent call last)")
    assert tracebacks == stderr.count("errors.ChildFailedError:") == 1, stderr[-3000:]


def run_cli(*args: str, stdin: str | bytes = b"") -> subprocess.CompletedProcess:
    """`attnlab ARGS` run in this process: its exit status, stdout and stderr as text, as
    subprocess.run(..., capture_output=True, text=True) gives them, without the seconds a new
    interpreter spends importing torch. What only a real process shows (the console script,
    tracebacks, signals, pipes) is tested with ATTNLAB."""
    from attnlab.cli import main

    out, err = io.StringIO(), io.StringIO()
    data = stdin.encode() if isinstance(stdin, str) else stdin
    saved, sys.stdin = sys.stdin, io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        sys.stdin = saved
    return subprocess.CompletedProcess(["attnlab", *args], code, out.getvalue(), err.getvalue())


# max_len: a recurrent or convolutional model's own; positions: a Transformer family's
TINY = dict(vocab_size=23, max_len=64, positions=dict(max_relative_distance=3, max_len=64))
TINY_STACK = dict(d_model=16, n_heads=4, n_layers=2, d_ff=32, dropout=0.0)
STACK_FIELDS = [f.name for f in dataclasses.fields(StackConfig)]


def sized(data: dict | None = None, /, **fields) -> tuple[FamilyConfig, DataShape]:
    """A model config and the data's sizes from one set of fields, as tests write them
    (``build_model(*sized(arch="decoder_lm", vocab_size=50, stack=...))``): the sizes (models/shape.py)
    go to the DataShape, the rest to the model config, and the config's checks of the sizes run."""
    fields = {**(data or {}), **fields}
    cfg = model_config({k: v for k, v in fields.items() if k not in SIZES})
    shape = DataShape(**{k: v for k, v in fields.items() if k in SIZES})
    cfg.check_shape(shape)
    return cfg, shape


def tiny_model(seed: int = 0, **overrides) -> torch.nn.Module:
    """A small model of any family (``arch``), built with a fixed seed, in eval mode: TINY's
    fields where the family has them (its vocabulary a size of the data), TINY_STACK's in its
    attention stack (or as its own fields: a recurrent model's d_model, n_layers and dropout), and
    ``overrides``, where a field of the stack may be given by name (``tiny_model(attention_backend="math")``);
    ``positions`` given are laid on TINY's, as the stack's are."""
    family = FAMILIES[overrides.get("arch", "encoder_decoder")]
    own = family.config.field_names() + sorted(SIZES)
    fields = {k: v for k, v in TINY.items() if k in own}
    if "stack" in own:
        by_name = {k: overrides.pop(k) for k in list(overrides) if k in STACK_FIELDS}
        fields["stack"] = {**TINY_STACK, **by_name, **overrides.pop("stack", {})}
    else:
        fields |= {k: v for k, v in TINY_STACK.items() if k in own}
    if "positions" in own:  # TINY's positions, with the overrides' fields on them
        fields["positions"] = {**TINY["positions"], **overrides.pop("positions", {})}
    torch.manual_seed(seed)
    return build_model(*sized(**{**fields, **overrides})).eval()


def eos_biased(model: nn.Module, eos_bias: float) -> nn.Module:
    """The model with a sharper output layer that favours EOS by ``eos_bias``: a random tiny model
    otherwise repeats one token to the length limit, and these tests need sentences and beams that
    end at different steps."""
    weight = model.generator.weight.detach()
    model.generator = nn.Linear(weight.shape[1], weight.shape[0], device=weight.device)
    with torch.no_grad():
        model.generator.weight.copy_(3 * weight)
        model.generator.bias.zero_()
        model.generator.bias[EOS] = eos_bias
    return model


def random_ids(batch: int, length: int, vocab: int = 23, generator_seed: int = 0) -> Tensor:
    """Token ids in [1, vocab): never the padding id 0."""
    g = torch.Generator().manual_seed(generator_seed)
    return torch.randint(1, vocab, (batch, length), generator=g)


def with_weights(attention: nn.Module, *args, **kwargs) -> tuple[Tensor, Tensor]:
    """An attention module's output for these arguments and the weights (B, H, Tq, Tk) that formed it,
    as attnlab.analysis.capture records them."""
    from attnlab.analysis.capture import capture_attention

    with capture_attention(attention) as captured:
        out = attention(*args, **kwargs)
    return out, captured.records[-1].probs


def assert_cached_matches_uncached(
    model: torch.nn.Module, tgt: Tensor, src: Tensor | None = None, chunks: list[int] | None = None, atol: float = 1e-5
) -> None:
    """Feed ``tgt`` to the model in pieces (``chunks`` sizes, default one token at a time) with a
    DecoderCache; the logits of every piece must equal the full, uncached pass at those positions.
    ``src`` makes it an EncoderDecoder check, otherwise a DecoderLM one."""
    T = tgt.shape[1]
    chunks = chunks or [1] * T
    assert sum(chunks) == T
    with torch.no_grad():
        if src is not None:
            full = model(src, tgt)
            memory, src_valid = model.encode(src)
        else:
            full = model(tgt)
        cache = model.new_cache()
        start = 0
        for size in chunks:
            piece = tgt[:, start : start + size]
            step = model.decode(piece, memory, src_valid, cache) if src is not None else model(piece, cache=cache)
            torch.testing.assert_close(
                step,
                full[:, start : start + size],
                atol=atol,
                rtol=0,
                msg=lambda m: f"positions {start}..{start + size - 1}: {m}",
            )
            start += size
        assert cache.length == T


def fixed_medians(seconds: dict[str, float] | None = None, default: float | None = None):
    """interleaved_medians with set medians (name -> seconds, else ``default``), each function run
    once: the benches' real steps run, and their figures are exact, whatever the machine's load.
    Tests never assert timings (DESIGN.md): a figure recomputed from rounded fields, or compared with
    a tolerance picked by hand, fails by chance on a loaded machine (issue 37, item 9)."""
    seconds = seconds or {}

    def medians(fns, repeats, **kwargs):
        for fn in fns.values():
            fn()
        return {name: seconds.get(name, default) for name in fns}

    return medians


# -- the settings of tests/test_cuda.py, which runs only on a GPU: tests/test_config.py reads them
# against the presets on the CPU, so that a renamed field does not go stale there unseen
CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def without_dropout(preset: Path) -> list[str]:
    """The --set overrides that turn ``preset``'s dropout off and train it eagerly: a Transformer's
    dropout is a field of its stack, a recurrent model's its own."""
    import yaml

    stacked = yaml.safe_load(preset.read_text())["model"].get("arch") != "rnn"
    return [f"model.{'stack.' if stacked else ''}dropout=0.0", "train.compile=false"]


# the recurrent run that tests/test_cuda.py trains, resumes and decodes on a GPU (eager: its
# subject is cuDNN's flat weights, not compilation), besides its data
RECURRENT_PRESET = CONFIGS / "rnn_bahdanau.yaml"
RECURRENT_SETS = [
    "model.d_model=64",
    "train.compile=false",
    "train.max_steps=6",
    "train.eval_every=3",
    "train.max_tokens=200",
    "train.device=cuda",
    "train.progress=false",
]
