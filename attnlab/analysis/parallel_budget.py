"""Per-rank training memory of each ``train.strategy`` on N ranks, from the same measurement as
analysis/budget.py (the model built and run forward on the meta device, the tensors autograd saves
counted once each): weights, gradients, Adam's two moments and saved activations per rank.

    one process  W, W, 2W, A(B)
    ddp          W, W, 2W, A(B / N)                 every rank a replica, its share of the batch
    fsdp         W / N + U, W / N, 2W / N, A(B / N) U: the largest unit (a layer), gathered in turn
    tp           W_r + W_s / N (likewise gradients and moments), A_r + A_s / N, the whole batch
                 (W_s, A_s: the matrices Megatron's plan splits and what is saved between them:
                 per-head tensors, the FFN's hidden layer; the rest replicated)
    pp           the most any stage holds, column by column: its W_k (and its gradients and
                 moments), its activations for the micro-batches in flight: all m under GPipe,
                 min(N, m) under 1F1B. attnlab keeps the
                 whole model object on every rank besides (parallel/pipeline.py), so its weights cost W.
    fsdp+tp      tp's share over the tp = ``tensor_parallel`` ranks of a group, W_t = W_r + W_s / tp,
                 sharded again over the dp = N / tp groups as fsdp shards: W_t / dp + U_t (U_t: the
                 largest unit's tp share, gathered), gradients W_t / dp, moments 2 W_t / dp, and
                 tp's activations for a dp group's share of the batch, (A_r + A_s / tp) / dp. The
                 fused projections' biases B_t, which FSDP leaves whole (parallel/fsdp_tp.py), are
                 held whole by every rank of a dp group: W_t - B_t is what dp divides.
"""

from __future__ import annotations

import re
from typing import Any, Callable, TypedDict, cast

import torch

from attnlab.analysis.budget import _inputs
from attnlab.errors import ConfigError
from attnlab.models.shape import DataShape
from attnlab.nn.interfaces import StagedModel, TensorParallelModel
from attnlab.nn.tensor_plan import ROWS, Split, TensorPlan
from attnlab.parallel.fsdp_tp import check_fsdp_tp
from attnlab.parallel.pipeline import check_pipeline
from attnlab.parallel.tensor_parallel import check_tensor_parallel

LAYER_INDEX = re.compile(r"(^|\.)layers\.(\d+)(\.|$)")


class MemoryRow(TypedDict, total=False):
    """One strategy's bytes per rank (:func:`parallel_memory`): the numbers, None where the strategy
    refuses the layout, and then ``refused``, its reason."""

    weights: int | None
    gradients: int | None
    adam_moments: int | None
    activations: int | None
    total: int | None
    refused: str


def _split_parameter(name: str, plan: TensorPlan) -> bool:
    """Whether the model's tensor-parallel plan (nn/tensor_plan.py) splits this parameter: the weights
    of the projections it names and their biases, except a row-split projection's (added once, whole)."""
    module, _, kind = name.rpartition(".")
    how = plan.linears.get(module)
    return how is not None and (how.split is Split.COLUMNS or kind != "bias")


def _split_activation(path: str, plan: TensorPlan) -> bool:
    """Whether tensor parallelism splits what the module at ``path`` saves: anything inside an
    attention or feed-forward module that the plan divides, except the input of a column-split
    projection (the replicated x)."""
    if plan.linears.get(path, ROWS).split is Split.COLUMNS:
        return False
    return any(path == region or path.startswith(region + ".") for region in plan.regions)


def stage_of_modules(cfg: Any, shape: DataShape, stages: int) -> dict[str, int]:
    """The pipeline stage of each module of ``cfg``'s model (by its path in the model) as the model
    cuts itself (its ``stages``, nn/stages.py; the meta device): a module that no stage holds (the
    model itself, a head its task does not read) is the last stage's, as parallel/pipeline.py keeps it."""
    from attnlab.models import build_model

    with torch.device("meta"):
        model = build_model(cfg, shape)
    path_of = {id(m): path for path, m in model.named_modules()}
    held = {
        path_of[id(m)]: s
        for s, stage in enumerate(cast(StagedModel, model).stages(stages))
        for m in stage.modules()
        if id(m) in path_of
    }
    return {path: held.get(path, stages - 1) for path in path_of.values()}


def refusal(check: Callable[..., None], *args: Any) -> str | None:
    """Why train.strategy would refuse this layout (the one line of the strategy's own ``check``), or
    None where it trains it."""
    try:
        check(*args)
    except ConfigError as err:
        return str(err)
    return None


def _stage_of(path: str, stage_of: dict[str, int]) -> int:
    """The stage of the module at ``path``, or of a parameter named by it."""
    return stage_of[path] if path in stage_of else stage_of[path.rpartition(".")[0]]


def measure(
    cfg: Any, shape: DataShape, seq_len: int, batch: int, src_len: int | None
) -> tuple[list[tuple[str, int]], list[tuple[str, int]], TensorPlan]:
    """[(parameter path, numel)] and [(path of the innermost module that saved it, numel)] for every
    tensor autograd saves in a training forward, each storage once (the meta device: no memory), and
    the model's tensor-parallel plan (an empty one where it declares none: all replicated)."""
    from attnlab.models import build_model

    with torch.device("meta"):
        model = build_model(cfg, shape).train()
        inputs = _inputs(cfg, batch, seq_len, src_len or seq_len)
    params = [(name, p.numel()) for name, p in model.named_parameters()]
    own = {id(p) for p in model.parameters()}
    running: list[str] = [""]
    saved: dict[int, tuple[str, int]] = {}

    def leave(module: torch.nn.Module, args: Any, out: Any) -> None:
        running.pop()

    for path, module in model.named_modules():
        module.register_forward_pre_hook(lambda m, a, path=path: running.append(path))
        module.register_forward_hook(leave)

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(base) not in own and t.is_floating_point() and id(base) not in saved:
            saved[id(base)] = (running[-1], base.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs)
    plan = model.tensor_plan() if isinstance(model, TensorParallelModel) else TensorPlan()
    return params, list(saved.values()), plan


def _fsdp_unbiased(name: str, plan: TensorPlan) -> bool:
    """Whether FSDP leaves the parameter out of its shards under fsdp+tp: a fused projection's bias."""
    module, _, kind = name.rpartition(".")
    return kind == "bias" and plan.linears.get(module, ROWS).blocks > 1


def _largest_unit(sizes: dict[str, float]) -> float:
    """The bytes of FSDP's largest unit (a layer, or the rest: parallel/fsdp_tp.py) of these parameters."""
    units: dict[str, float] = {}
    for name, n in sizes.items():
        match = LAYER_INDEX.search(name)
        unit = name[: match.end(2)] if match else ""
        units[unit] = units.get(unit, 0) + n
    return max(units.values())


def parallel_memory(
    cfg: Any,
    shape: DataShape,
    seq_len: int,
    batch: int,
    ranks: int,
    micro_batches: int,
    src_len: int | None = None,
    bytes_per_value: int = 4,
    tensor_parallel: int = 2,
) -> dict[str, MemoryRow]:
    """{strategy: {'weights', 'gradients', 'adam_moments', 'activations', 'total'}} in bytes per rank
    for a global batch of ``batch`` sequences on ``ranks`` ranks, the model of ``cfg`` and the data's
    sizes ``shape``. Where train.strategy refuses the
    layout (tp and fsdp+tp: heads or widths the tensor-parallel size does not divide, a size that
    does not divide the ranks; pp: a family not cut into stages, fewer layers than ranks, tied
    embeddings), the numbers are None and 'refused' holds the strategy's own one-line reason."""
    params, saved, plan = measure(cfg, shape, seq_len, batch, src_len)
    b = bytes_per_value
    W = sum(n for _, n in params) * b
    A = sum(n for _, n in saved) * b

    def row(weights: float, state: float, activations: float) -> MemoryRow:
        return {
            "weights": int(weights),
            "gradients": int(state),
            "adam_moments": int(2 * state),
            "activations": int(activations),
            "total": int(weights + 3 * state + activations),
        }

    W_split = sum(n for name, n in params if _split_parameter(name, plan)) * b
    A_split = sum(n for path, n in saved if _split_activation(path, plan)) * b
    report: dict[str, MemoryRow] = {
        "one process": row(W, W, A),
        "ddp": row(W, W, A / ranks),
        "fsdp": row(W / ranks + _largest_unit({name: n * b for name, n in params}), W / ranks, A / ranks),
        "tp": refused(refusal(check_tensor_parallel, cfg, ranks, "tp"))
        or row(W - W_split + W_split / ranks, W - W_split + W_split / ranks, A - A_split + A_split / ranks),
    }
    cut = refusal(check_pipeline, cfg, ranks)
    stage_of = stage_of_modules(cfg, shape, ranks) if cut is None else None
    for schedule, in_flight in (("gpipe", micro_batches), ("1f1b", min(ranks, micro_batches))):
        if stage_of is None:
            report[f"pp {schedule}"] = cast(MemoryRow, refused(cut))  # cut is a reason where stage_of is None
            continue
        stage_w = [0] * ranks
        stage_a = [0] * ranks
        for name, n in params:
            stage_w[_stage_of(name, stage_of)] += n * b
        for path, n in saved:
            stage_a[_stage_of(path, stage_of)] += n * b
        report[f"pp {schedule}"] = row(W, max(stage_w), max(stage_a) * in_flight / micro_batches)
    report["fsdp+tp"] = refused(refusal(check_fsdp_tp, cfg, ranks, tensor_parallel)) or _fsdp_tp(
        params, plan, A, A_split, b, ranks, tensor_parallel, row
    )
    return report


NUMBERS = ("weights", "gradients", "adam_moments", "activations", "total")


def refused(reason: str | None) -> MemoryRow | None:
    """A row of a layout the strategy refuses: no numbers, and the reason; None where it is trained."""
    # NUMBERS are MemoryRow's numbers, each None
    return None if reason is None else cast(MemoryRow, {**dict.fromkeys(NUMBERS), "refused": reason})


def _fsdp_tp(
    params: list[tuple[str, int]],
    plan: TensorPlan,
    A: float,
    A_split: float,
    b: int,
    ranks: int,
    tp: int,
    row: Callable[[float, float, float], MemoryRow],
) -> MemoryRow:
    """The fsdp+tp row (the module's docstring) of a layout train.strategy fsdp+tp trains."""
    dp = ranks // tp
    share = {name: n * b / tp if _split_parameter(name, plan) else n * b for name, n in params}  # W_t, each
    whole = sum(n for name, n in share.items() if _fsdp_unbiased(name, plan))  # B_t
    sharded = {name: n for name, n in share.items() if not _fsdp_unbiased(name, plan)}
    state = sum(sharded.values()) / dp + whole
    return row(state + _largest_unit(sharded), state, (A - A_split + A_split / tp) / dp)


def format_parallel_memory(
    report: dict[str, MemoryRow], ranks: int, micro_batches: int, tensor_parallel: int = 2
) -> str:
    gib: Callable[[int | None], str] = lambda n: "n/a" if n is None else f"{n / 2**30:.3f}"  # noqa: E731
    groups = (
        f"tp {tensor_parallel} x dp {ranks // tensor_parallel}"
        if ranks % tensor_parallel == 0
        else f"tp {tensor_parallel}"
    )
    lines = [
        f"training memory per rank, GiB, on {ranks} ranks (pp: {micro_batches} micro-batches; fsdp+tp: "
        f"{groups}; meta device)",
        f"  {'strategy':<14}{'weights':>10}{'gradients':>11}{'adam':>10}{'activations':>13}{'total':>10}",
    ]
    for name, r in report.items():
        lines.append(
            f"  {name:<14}{gib(r['weights']):>10}{gib(r['gradients']):>11}{gib(r['adam_moments']):>10}"
            f"{gib(r['activations']):>13}{gib(r['total']):>10}"
        )
    reasons: dict[str, list[str]] = {}  # reason -> the rows it empties (pp's two schedules share one)
    for name, r in report.items():
        if r.get("refused"):
            reasons.setdefault(str(r["refused"]), []).append(name)
    lines += [f"  n/a ({', '.join(names)}): {reason}" for reason, names in reasons.items()]
    return "\n".join(lines)
