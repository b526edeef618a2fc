"""How the ranks of a torchrun job share one training run (``train.strategy``): what ``fit`` asks
of a strategy is the module to train, which ranks take different batches, and the checkpoint's
weights and optimizer state whole (every rank calls; rank 0 receives them).

    ddp   every rank holds all the weights and trains its own share of each global batch;
          DistributedDataParallel averages the gradients
    fsdp  as ddp, but each layer's weights, gradients and Adam moments are 1/N per rank (FSDP2's
          fully_shard), gathered for the layer's forward and backward only
    tp    every rank trains the same batches; each layer's matrices are 1/N per rank, the heads
          divided among them (Megatron's plan, parallel/tensor_parallel.py)
    pp    every rank trains the same batches, cut into micro-batches; each holds 1/N of the layers
          (a pipeline stage, parallel/pipeline.py)
    fsdp+tp  PyTorch's 2-D recipe on a (dp, tp) mesh: tp within each group of ``train.tensor_parallel``
          ranks, whose batches are the same, then fsdp over the dp = N / tp groups, whose batches differ

With data parallelism (ddp, fsdp, fsdp+tp's dp) the loss is normalised by the token count of the whole global
batch, so an update equals the one a single process would make over all of it. A checkpoint is
the usual whole-model file, which every command reads; the optimizer state of a strategy that
splits the weights is saved whole and by parameter name, so it resumes under that strategy only
(``layout``, recorded in the trainer state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from attnlab.errors import CheckpointError, ConfigError
from attnlab.parallel.distributed import World
from attnlab.runs.train_config import TrainConfig
from attnlab.train.step import accumulate_gradients, clip_gradients, load_optimizer_state

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions


def _whole_options(cpu_offload: bool = True) -> StateDictOptions:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)  # gathered (on rank 0's CPU)


class Strategy:
    """One process, or replicas under ``ddp``: the weights and the optimizer state as they are."""

    name: ClassVar[str] = "ddp"
    splits_batches: ClassVar[bool] = True  # each rank trains its own share of a global batch
    layout: ClassVar[str | None] = None  # how the saved optimizer state is keyed: None, by index

    def __init__(self, cfg: TrainConfig, world: World | None, task: Any = None) -> None:
        self.cfg, self.world, self.task = cfg, world, task  # the task: what a pipeline's batches feed its stages
        self.accumulate_gradients = accumulate_gradients  # the gradients of an update (a pipeline's: its own)
        self.clip_gradients = clip_gradients

    @property
    def data_world(self) -> World | None:
        """The ranks among which a global batch is shared (None: each trains all of it)."""
        return self.world if self.splits_batches else None

    def prepare(self, model: nn.Module, device: torch.device) -> nn.Module:
        """The module that training runs: DDP's wrapper of ``model`` under torchrun."""
        if self.world is None:
            return model
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    def assemble(self, model: nn.Module) -> None:
        """Make ``model`` whole on every rank before it is validated (every rank calls)."""

    def weights(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return model.state_dict()

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        load_optimizer_state(optimizer, state)

    def check_resumable(self, where: str, saved_layout: Any) -> None:
        """Refuse in one line an optimizer state saved in another layout (True: fsdp, before layouts had names)."""
        saved = "fsdp" if saved_layout is True else (saved_layout or None)
        if saved != self.layout:
            was = "one process or train.strategy ddp" if saved is None else f"train.strategy {saved} under torchrun"
            raise CheckpointError(f"{where}: trained with {was}, whose optimizer state resumes only the same way")


class ShardedStrategy(Strategy):
    """A strategy whose parameters are DTensors split across the ranks: a checkpoint gathers them,
    and the optimizer state by parameter name; resuming splits both again."""

    def weights(self, model: nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        # a full state dict's values are whole tensors
        return cast(dict[str, torch.Tensor], get_model_state_dict(model, options=_whole_options()))

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer, options=_whole_options())

    def load_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=_whole_options(cpu_offload=False))


class FullyShardedDataParallel(ShardedStrategy):
    """FSDP2: each layer of a stack is one unit, the rest (embeddings, output) one more, and a unit's
    parameters are gathered from the ranks for its forward and backward only."""

    name = layout = "fsdp"

    def prepare(self, model: nn.Module, device: torch.device) -> nn.Module:
        from attnlab.parallel.fsdp_tp import fully_sharded

        return fully_sharded(model)


class TensorParallel(ShardedStrategy):
    """Megatron-style tensor parallelism over all the ranks (parallel/tensor_parallel.py)."""

    name = layout = "tp"
    splits_batches = False

    def prepare(self, model: nn.Module, device: torch.device) -> nn.Module:
        from attnlab.parallel.tensor_parallel import tensor_parallel

        assert self.world is not None  # strategy_for makes it for a torchrun job only
        return tensor_parallel(model, self.world.size, device.type)

    @staticmethod
    def check(model_cfg: Any, size: int) -> None:
        from attnlab.parallel.tensor_parallel import check_tensor_parallel

        check_tensor_parallel(model_cfg, size)


class PipelineParallel(Strategy):
    """Pipeline stages of a model, one per rank, under GPipe or 1F1B (parallel/pipeline.py).
    The optimizer state is merged into one process's, so it resumes under ddp or one process too."""

    name = "pp"
    splits_batches = False
    pipeline = None  # made by prepare (not for a model with nothing to learn, trained by no one)

    def prepare(self, model: nn.Module, device: torch.device) -> nn.Module:
        from attnlab.parallel.pipeline import Pipeline

        assert self.world is not None  # strategy_for makes it for a torchrun job only
        self.pipeline = Pipeline(
            model, self.world, self.task, self.cfg.pipeline_schedule, self.cfg.micro_batches, device
        )
        self.accumulate_gradients = self.pipeline.accumulate_gradients
        self.clip_gradients = self.pipeline.clip_gradients
        return self.pipeline.stage

    def assemble(self, model: nn.Module) -> None:
        if self.pipeline is not None:
            self.pipeline.assemble()

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        if self.pipeline is None:
            return optimizer.state_dict()
        return self.pipeline.merged_optimizer_state(optimizer)

    @staticmethod
    def check(model_cfg: Any, size: int, task: Any = None) -> None:
        from attnlab.parallel.pipeline import check_pipeline

        check_pipeline(model_cfg, size, task)


class FullyShardedTensorParallel(ShardedStrategy):
    """fsdp over the dp dimension of a (dp, tp) mesh, each dp rank a tp group (parallel/fsdp_tp.py)."""

    name = layout = "fsdp+tp"

    def __init__(self, cfg: TrainConfig, world: World | None, task: Any = None) -> None:
        from attnlab.parallel.fsdp_tp import two_d_mesh

        super().__init__(cfg, world, task)
        assert world is not None  # strategy_for makes it for a torchrun job only
        self.mesh = two_d_mesh(world, cfg.tensor_parallel)

    @property
    def data_world(self) -> World:
        dp = self.mesh["dp"]
        assert self.world is not None  # strategy_for makes it for a torchrun job only
        return World(dp.get_local_rank(), dp.size(), self.world.device, dp.get_group())

    def prepare(self, model: nn.Module, device: torch.device) -> nn.Module:
        from attnlab.parallel.fsdp_tp import fully_sharded_tensor_parallel

        return fully_sharded_tensor_parallel(model, self.mesh)

    @staticmethod
    def check(model_cfg: Any, size: int, tensor_parallel: int = 2) -> None:
        from attnlab.parallel.fsdp_tp import check_fsdp_tp

        check_fsdp_tp(model_cfg, size, tensor_parallel)


STRATEGY_CLASSES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (Strategy, FullyShardedDataParallel, TensorParallel, PipelineParallel, FullyShardedTensorParallel)
}


def strategy_for(cfg: TrainConfig, world: World | None, task: Any = None) -> Strategy:
    """The strategy ``train.strategy`` names, for this torchrun job (one process: as it is), training ``task``."""
    return Strategy(cfg, None) if world is None else STRATEGY_CLASSES[cfg.strategy](cfg, world, task)


def check_batches(cfg: TrainConfig, data: Any, world: World | None) -> None:
    """Refuse in one line the training batches this job's strategy cannot run (pp: batches its
    micro-batches do not divide), once the data is prepared and before the run directory is written."""
    if world is not None and STRATEGY_CLASSES[cfg.strategy] is PipelineParallel:
        from attnlab.parallel.pipeline import check_batch_rows

        check_batch_rows(data, cfg.micro_batches)


def check_strategy(name: str, model_cfg: Any, world: World | None, tensor_parallel: int = 2, task: Any = None) -> None:
    """Refuse in one line a strategy that this job or this model cannot run: tensor and pipeline
    parallelism need torchrun with two or more ranks, and a model they can split that many ways
    (a pipeline, a ``task`` whose batches it can feed)."""
    cls = STRATEGY_CLASSES.get(name)
    if name in ("tp", "pp", "fsdp+tp") and world is None:
        raise ConfigError(
            f"train.strategy {name} splits the model across processes: start it with torchrun "
            f"--nproc_per_node N (N >= 2), or use train.strategy ddp"
        )
    if world is not None and cls is FullyShardedTensorParallel:
        cls.check(model_cfg, world.size, tensor_parallel)
    elif world is not None and cls is PipelineParallel:
        cls.check(model_cfg, world.size, task)
    elif world is not None and cls is not None and hasattr(cls, "check"):
        cls.check(model_cfg, world.size)
