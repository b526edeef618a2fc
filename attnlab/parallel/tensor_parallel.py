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

The plan is keyed on the parameters' names inside a stack's layers (``layers.<i>.``), not on module
classes: ``qkv_proj``, ``kv_proj`` (blocks split), ``q_proj`` (columns), ``out_proj`` (rows),
``feed_forward.w_1`` (columns), ``feed_forward.w_2`` (rows); the module owning the projections
keeps ``n_heads / N`` heads.
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

from attnlab.errors import ConfigError
from attnlab.models import stack_of
from attnlab.torch_private import blockwise_colwise_parallel

IN_LAYER = re.compile(r"(^|\.)layers\.\d+\.")
BLOCKS = {"qkv_proj": 3, "kv_proj": 2}  # stacked matrices of a fused projection
COLUMNS = ("q_proj", "feed_forward.w_1")
ROWS = ("out_proj", "feed_forward.w_2")
PER_HEAD_POSITIONAL = ("relative", "relative_bias", "alibi")  # state per head, or parameters used inside attention


def check_tensor_parallel(model_cfg: Any, size: int, strategy: str = "tp") -> None:
    """Refuse in one line a model that ``size`` ranks cannot split head by head."""
    if (stack := stack_of(model_cfg)) is None:
        raise ConfigError(f"train.strategy {strategy} splits attention heads and feed-forward widths; model.arch "
                          f"'{model_cfg.arch}' has none")
    for name in ("n_heads", "d_ff"):  # d_model = n_heads * d_head divides when n_heads does
        if getattr(stack, name) % size:
            raise ConfigError(f"train.strategy {strategy}: model.stack.{name} ({getattr(stack, name)}) must be "
                              f"divisible by the tensor-parallel size ({size} ranks)")
    if getattr(model_cfg, "positional", None) in PER_HEAD_POSITIONAL:
        raise ConfigError(f"train.strategy {strategy}: model.positional '{model_cfg.positional}' keeps state shared "
                          f"by or per head inside attention; use sinusoidal, learned, rotary or none")
    if getattr(model_cfg, "attention_scale", None) == "learned":
        raise ConfigError(f"train.strategy {strategy}: model.attention_scale 'learned' is one parameter that every "
                          f"head's scores use; use sqrt_dk or none")


def megatron_plan(model: nn.Module) -> dict[str, Any]:
    """{module path: ParallelStyle} for every projection of every layer of ``model``'s stacks."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {}
    for path, module in model.named_modules():
        if not IN_LAYER.search(path) or not isinstance(module, nn.Linear):
            continue
        leaf = path.rpartition(".")[2]
        if leaf in BLOCKS:
            plan[path] = blockwise_colwise_parallel()(BLOCKS[leaf])
        elif path.endswith(COLUMNS):
            plan[path] = ColwiseParallel()
        elif path.endswith(ROWS):
            plan[path] = RowwiseParallel()
    return plan


def tensor_parallel(model: nn.Module, size: int, device_type: str, mesh: Any = None) -> nn.Module:
    """``model`` split in place over a 1-D mesh of ``size`` ranks (all of them, or ``mesh``: one
    dimension of a larger one): Megatron's plan, and each attention module left with its share of
    the heads."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(device_type, (size,)) if mesh is None else mesh
    plan = megatron_plan(model)
    parallelize_module(model, mesh, plan)
    modules = dict(model.named_modules())
    for path in plan:
        owner = modules[path.rpartition(".")[0]]
        if path.endswith(("qkv_proj", "q_proj")):  # the attention module: (B, T, H/N * Dh) per rank
            owner.n_heads //= size
    return model
