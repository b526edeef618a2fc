"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) with PyTorch's own engine,
``torch.distributed.tensor.parallel``: every rank holds 1/N of each layer's matrices and all ranks
compute the same batch together.

Attention, heads divided across ranks:  head_i = Attention(x W_i^Q, x W_i^K, x W_i^V) for the
rank's n_heads / N heads (W^Q, W^K, W^V split by output columns: ColwiseParallel), then
MultiHead = sum over ranks of Concat(its heads) W^O_rank (W^O split by input rows: RowwiseParallel,
one all-reduce). The feed-forward: act(x W_1) with W_1 split by columns, times W_2 split by rows,
one all-reduce. Everything else (embeddings, norms, the output projection) is replicated, and its
gradient is the same on every rank because its inputs are.

attnlab fuses Q, K, V into one ``qkv_proj`` (d -> 3d) and K, V into ``kv_proj``. A plain
column split of the fused matrix would give rank 0 all of Q; here each of the stacked blocks is
split, so that a rank's rows are [Q_r; K_r; V_r]: DTensor's ``_StridedShard(0, split_factor=3)``,
the placement FSDP2 itself uses for a shard of a shard (private in PyTorch 2.13). A gathered
weight (``full_tensor``) is in the model's own order, so checkpoints are the usual file.

The plan is the model's own (its ``tensor_plan()``, nn/tensor_plan.py: which linears are split by
columns, by rows or block by block, and which attention modules keep ``n_heads / N`` heads); a
family whose model declares none is refused in one line before any process work.
"""

from __future__ import annotations

from typing import Any, cast

from torch import nn

from attnlab.errors import ConfigError
from attnlab.models import stack_of
from attnlab.models.transformer_config import Positions
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.interfaces import TensorParallelModel
from attnlab.nn.tensor_plan import LinearSplit, Split, TensorPlan
from attnlab.torch_private import blockwise_colwise_parallel

PER_HEAD_POSITIONAL = ("relative", "relative_bias", "alibi")  # state per head, or parameters used inside attention


def check_tensor_parallel(model_cfg: Any, size: int, strategy: str = "tp") -> None:
    """Refuse in one line a model that declares no tensor-parallel plan, or that ``size`` ranks cannot
    split head by head."""
    stack, model = stack_of(model_cfg), model_cfg.family.model
    if not issubclass(model, TensorParallelModel):
        if stack is None:
            raise ConfigError(
                f"train.strategy {strategy} splits attention heads and feed-forward widths; model.arch "
                f"'{model_cfg.arch}' has none"
            )
        raise ConfigError(
            f"train.strategy {strategy}: model.arch '{model_cfg.arch}' has an attention stack but its "
            f"model ({model.__name__}) declares no tensor-parallel plan (a tensor_plan method, "
            f"nn/tensor_plan.py)"
        )
    if stack is None:  # the model's own plan, with no stack's heads and widths to check
        return
    for name in ("n_heads", "d_ff"):  # d_model = n_heads * d_head divides when n_heads does
        if getattr(stack, name) % size:
            raise ConfigError(
                f"train.strategy {strategy}: model.stack.{name} ({getattr(stack, name)}) must be "
                f"divisible by the tensor-parallel size ({size} ranks)"
            )
    positions = getattr(model_cfg, "positions", None)  # a Transformer family's (models/transformer_config.py)
    if isinstance(positions, Positions) and positions.scheme in PER_HEAD_POSITIONAL:
        raise ConfigError(
            f"train.strategy {strategy}: model.positions.scheme '{positions.scheme}' keeps state shared "
            f"by or per head inside attention; use sinusoidal, learned, rotary or none"
        )
    if stack.attention_scale == "learned":
        raise ConfigError(
            f"train.strategy {strategy}: model.stack.attention_scale 'learned' is one parameter that every "
            f"head's scores use; use sqrt_dk or none"
        )


def parallel_styles(plan: TensorPlan) -> dict[str, Any]:
    """{module path: ParallelStyle} for each linear that ``plan`` divides."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def style(how: LinearSplit) -> Any:
        if how.blocks > 1:
            return blockwise_colwise_parallel()(how.blocks)
        return ColwiseParallel() if how.split is Split.COLUMNS else RowwiseParallel()

    return {path: style(how) for path, how in plan.linears.items()}


def tensor_parallel(model: nn.Module, size: int, device_type: str, mesh: Any = None) -> nn.Module:
    """``model`` split in place over a 1-D mesh of ``size`` ranks (all of them, or ``mesh``: one
    dimension of a larger one) as its ``tensor_plan()`` says, each attention module it names left
    with its share of the heads."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(device_type, (size,)) if mesh is None else mesh
    plan = cast(TensorParallelModel, model).tensor_plan()  # check_tensor_parallel refused a model without one
    parallelize_module(model, mesh, parallel_styles(plan))
    for path in plan.heads:  # (B, T, H/N * Dh) per rank
        cast(MultiHeadAttention, model.get_submodule(path)).n_heads //= size
    return model
