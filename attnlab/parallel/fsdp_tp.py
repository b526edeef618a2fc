"""FSDP2 composed with tensor parallelism (``train.strategy fsdp+tp``), PyTorch's 2-D recipe: the
ranks form a (dp, tp) mesh, tp = ``train.tensor_parallel`` consecutive ranks; within each tp group
Megatron's plan splits every layer (parallel/tensor_parallel.py), and ``fully_shard`` then splits each
rank's share again over the dp dimension, whose ranks train different batches (gradients
reduce-scattered over dp, as fsdp's are over all ranks). ``fully_sharded`` makes FSDP2's units, one
per layer of a stack and one more, for fsdp too.

Two placements FSDP2 does not compose with in PyTorch 2.13 (found by tests/test_parallel.py's
gradients): a fused projection's weight, split block by block for tp (``_StridedShard(0)``), when
FSDP shards the same dimension, gathers to the wrong matrix, so FSDP shards it by input columns
(``Shard(1)``) instead; its bias (1-D, nothing else to shard) gathers right but gets wrong gradients,
so FSDP leaves it alone (``ignored_params``) and a gradient hook averages it over dp, as FSDP does
its own.
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn

from attnlab.errors import ConfigError
from attnlab.nn.interfaces import Classifier, EncodingModel, Seq2SeqModel
from attnlab.parallel.distributed import World
from attnlab.parallel.tensor_parallel import check_tensor_parallel, tensor_parallel
from attnlab.torch_private import is_strided_shard

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

FORWARD_METHODS = {EncodingModel: "encode", Seq2SeqModel: "decode", Classifier: "classify"}  # validation calls them


# PyTorch's notes that a user cannot act on, filtered by their text alone (every other warning shows):
# FSDP2 warns that a wrapped model returns a view, on which an in-place op would skip its all-gather
# (attnlab's losses read the outputs out of place: tests/test_parallel.py's fsdp and fsdp+tp runs give
# one process's gradients), and DTensor logs that making a tensor split over (tp, dp) whole takes two
# collectives (done for checkpoints and the gradient norm, not in the step's forward and backward).
VIEW_OUTPUT = r"FSDP2-wrapped module \(.*\) returned a view tensor"
SEQUENTIAL_COLLECTIVES = re.compile(r"2 sequential all_(gather|reduce) operations will be performed")


def quiet_sharding_notes() -> None:
    """Filter the two notes above, in this process."""
    warnings.filterwarnings("ignore", message=VIEW_OUTPUT, category=UserWarning)
    logging.getLogger("torch.distributed.tensor._redistribute").addFilter(
        lambda record: not SEQUENTIAL_COLLECTIVES.search(record.getMessage())
    )


def check_fsdp_tp(model_cfg: Any, size: int, tp: int) -> None:
    """Refuse in one line a tensor-parallel size that does not divide the ranks, or the model."""
    if size % tp:
        raise ConfigError(
            f"train.strategy fsdp+tp: train.tensor_parallel ({tp}) must divide the torchrun ranks ({size})"
        )
    check_tensor_parallel(model_cfg, tp, "fsdp+tp")


def fully_sharded(model: nn.Module, **options: Any) -> nn.Module:
    """``model`` under fully_shard (``options``: its keyword arguments), a unit per layer and one more."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    quiet_sharding_notes()

    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rpartition(".")[2] == "layers":
            for layer in module:
                fully_shard(layer, **options)
    fully_shard(model, **options)
    for interface, method in FORWARD_METHODS.items():
        if isinstance(model, interface):
            register_fsdp_forward_method(model, method)
    return model


def two_d_mesh(world: World, tp: int) -> Any:
    """The (dp, tp) DeviceMesh: rank = dp_rank * tp + tp_rank."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(world.device.type, (world.size // tp, tp), mesh_dim_names=("dp", "tp"))


def _block_split(p: nn.Parameter) -> bool:
    """Whether tp split ``p`` block by block (a fused projection's)."""
    return is_strided_shard(getattr(p, "placements", (None,))[0])


def fully_sharded_tensor_parallel(model: nn.Module, mesh: Any) -> nn.Module:
    """``model`` split over ``mesh["tp"]`` by Megatron's plan, then fully sharded over ``mesh["dp"]``."""
    from torch.distributed.tensor import Shard

    tensor_parallel(model, mesh["tp"].size(), mesh.device_type, mesh["tp"])
    fused = [m for m in model.modules() if isinstance(m, nn.Linear) and m.bias is not None and _block_split(m.bias)]
    dp_group, dp = mesh["dp"].get_group(), mesh["dp"].size()

    def averaged_over_dp(grad: torch.Tensor) -> torch.Tensor:
        # the gradient of a bias tp split (a DTensor): this backward's, before it is accumulated
        local = cast("DTensor", grad).to_local()
        dist.all_reduce(local, group=dp_group)
        local.div_(dp)
        return grad

    def hook_bias(module: nn.Linear, args: Any) -> None:  # one of ``fused``
        """On the bias the module holds now: a resume's ``model.to`` replaces a DTensor parameter."""
        if not getattr(module.bias, "averaged_over_dp", False):
            module.bias.register_hook(averaged_over_dp)
            setattr(module.bias, "averaged_over_dp", True)  # a mark torch's Tensor does not declare

    for module in fused:
        module.register_forward_pre_hook(hook_bias)
    return fully_sharded(
        model,
        mesh=mesh["dp"],
        ignored_params={m.bias for m in fused},
        shard_placement_fn=lambda p: Shard(1 if _block_split(p) else 0),
    )
