"""Every private PyTorch API that attnlab uses, and nothing else: no other module names a private
torch attribute (tests/test_torch_private.py scans the package), so a PyTorch upgrade that moves
one fails in one place. Each is here because the public API has no equivalent yet:

    _StridedShard                  DTensor's placement of a fused W^Q|W^K|W^V split block by block
                                   (parallel/tensor_parallel.py, parallel/fsdp_tp.py)
    _partition_linear_fn           ColwiseParallel's hook that places a linear layer's weights,
                                   overridden to place them block by block
    found_inf, _step_supports_amp_scaling
                                   the fused optimizers' own skip of an update, read on the device:
                                   the protocol GradScaler uses (train/step.py)
    fx.experimental._config        use_duck_shape, to trace each batch size as its own symbol
    _inductor.config               Inductor's switches (train/step.py's no_size_guards)
    _dynamo.utils.counters         TorchInductor's event counts (bench/shapes.py)
    _make_per_channel_quantized_tensor  an int8 weight rebuilt from its stored values and scales
                                   (decode/weights.py)

TESTED lists the PyTorch versions (major.minor) on which each name was checked; the test fails on
any other, so that an upgrade checks them again. The heavy modules (Dynamo, Inductor,
torch.distributed.tensor) are imported only when asked for.
"""

from __future__ import annotations

import contextlib
import functools
from types import ModuleType
from typing import Any, Iterator

import torch
from torch import nn

TESTED = ("2.13",)


def strided_shard(dim: int, split_factor: int) -> Any:
    """DTensor's placement that shards ``dim`` in ``split_factor`` blocks, each block split across
    the ranks (rank r holds block b's r-th part, for every b)."""
    from torch.distributed.tensor.placement_types import _StridedShard

    return _StridedShard(dim, split_factor=split_factor)


def is_strided_shard(placement: Any) -> bool:
    """Whether ``placement`` is one that :func:`strided_shard` makes."""
    from torch.distributed.tensor.placement_types import _StridedShard

    return isinstance(placement, _StridedShard)


@functools.cache
def blockwise_colwise_parallel() -> type:
    """ColwiseParallel for matrices stacked by output rows, split block by block: the class, made on
    first use (torch.distributed.tensor costs a process ~0.8 s at import). It overrides
    ColwiseParallel's private ``_partition_linear_fn``."""
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel

    class BlockwiseColwiseParallel(ColwiseParallel):
        """ColwiseParallel for ``blocks`` matrices stacked by output rows ([W^Q; W^K; W^V]): each block
        split across the ranks, so that rank r holds [W^Q_r; W^K_r; W^V_r] and its output
        (B, T, blocks * d / N) is its own heads' queries, keys and values, in the module's order."""

        def __init__(self, blocks: int) -> None:
            # the output stays as the rank computed it: (B, T, blocks * d / N), strided on the last dim
            super().__init__(output_layouts=strided_shard(2, blocks))
            self.blocks = blocks

        def _partition_linear_fn(self, name: str, module: nn.Module, device_mesh: Any) -> None:
            for param_name, param in list(module.named_parameters()):
                placed = distribute_tensor(param, device_mesh, [strided_shard(0, self.blocks)])
                module.register_parameter(param_name, nn.Parameter(placed, requires_grad=param.requires_grad))

    return BlockwiseColwiseParallel


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer``'s step reads a device flag that skips it (the fused Adam and AdamW)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def step_unless(optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """One step of an optimizer that :func:`skips_on_device`, which leaves the weights and moments as
    they were where ``skip`` (a bool tensor on the device) is True; the host never reads it."""
    setattr(optimizer, "found_inf", skip.float())  # read by the fused step; no public way to set it
    optimizer.step()


@contextlib.contextmanager
def without_duck_sizing() -> Iterator[None]:
    """Tracing in which each size is its own symbol, even where two sizes happen to be equal."""
    import torch.fx.experimental._config as fx_config

    with getattr(fx_config, "patch")(use_duck_shape=False):  # made when torch installs the config module
        yield


def inductor_config() -> ModuleType:
    """TorchInductor's configuration module (two seconds to import: only where a run compiles)."""
    import torch._inductor.config as inductor

    return inductor


def inductor_counters() -> dict[str, int]:
    """TorchInductor's event counts in this process (imports TorchDynamo)."""
    from torch._dynamo.utils import counters

    return counters["inductor"]


def per_channel_quantized(values: torch.Tensor, scales: torch.Tensor, axis: int = 0) -> torch.Tensor:
    """A quantized tensor from its int8 ``values`` and one float64 scale per slice along ``axis``,
    symmetric (zero points 0): value x scale."""
    return torch._make_per_channel_quantized_tensor(values, scales, torch.zeros_like(scales, dtype=torch.long), axis)
