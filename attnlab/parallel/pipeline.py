"""Pipeline parallelism with PyTorch's own engine, ``torch.distributed.pipelining``: rank s of N
holds stage s, a run of consecutive layers of a model whose family declares its ``staging``
(models/family.py: decoder-only, encoder-only, encoder-decoder: the encoder's layers, then the
decoder's, the memory carried from stage to stage), the first stage also the embeddings, the last
the final norm and the head that the task's loss reads (nn/stages.py), and each batch flows through
the stages cut into ``train.micro_batches`` micro-batches, as ``train.pipeline_schedule`` orders them:

    gpipe  every micro-batch's forward, then every backward (Huang et al. 2019)
    1f1b   after a warm-up, one forward and one backward in turn, so that a stage keeps at most N
           micro-batches' activations instead of m (PipeDream-Flush, Narayanan et al. 2021)

Either way a stage waits (N - 1) of the (m + N - 1) micro-batch slots of a step: the bubble,
(N - 1) / (m + N - 1) (docs/performance/parallel.md measures it). Each micro-batch's loss is its sum over
targets divided by the targets of the whole update, so the gradients are one process's over the
same micro-batches accumulated. What a batch feeds the stages is the task's to say (``piped``).

Every rank keeps the whole model object, training its own stage's parameters only; before an
evaluation or a checkpoint each stage broadcasts its parameters (``assemble``), so that validation
and the weights file see the whole model, and the optimizer states of the stages are merged into
the one a single process would have (it resumes under any strategy that keeps them whole).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.models import FAMILIES
from attnlab.nn.interfaces import StagedModel
from attnlab.nn.losses import label_smoothed_nll
from attnlab.parallel.distributed import World
from attnlab.tasks import Pipelined, Task
from attnlab.tasks.abilities import Piped
from attnlab.tasks.batching import Batch, BucketedData


def check_pipeline(model_cfg: Any, stages: int, task: Task[Any, Any] | None = None) -> None:
    """Refuse in one line a model (or a task) that cannot be cut into ``stages`` pipeline stages here."""
    staging = model_cfg.family.staging
    if staging is None:
        cut = ", ".join(name for name, family in FAMILIES.items() if family.staging is not None)
        raise ConfigError(
            f"train.strategy pp cuts models of model.arch {cut} into stages; model.arch is '{model_cfg.arch}'"
        )
    if staging.layers(model_cfg) < stages:
        raise ConfigError(
            f"train.strategy pp: the model's {staging.layers(model_cfg)} layers are fewer than the "
            f"pipeline stages ({stages} ranks)"
        )
    if "output" in model_cfg.tied:
        raise ConfigError(
            f"train.strategy pp: model.embeddings.tie '{model_cfg.embeddings.tie}' shares the first "
            f"stage's embedding with the last stage's output projection; set it to none"
        )
    staging.check(model_cfg)
    if task is not None and not (isinstance(task, Pipelined) and task.pipeline_head in staging.heads):
        raise ConfigError(
            f"train.strategy pp: data.task {task.name} is not trained through pipeline stages of "
            f"model.arch {model_cfg.arch}"
        )


def check_batch_rows(data: Any, micro_batches: int) -> None:
    """Refuse in one line, every problem at once and before a run directory is written, training
    batches that ``micro_batches`` cannot cut into equal micro-batches: a token budget's (their rows
    vary), or a fixed number of rows it does not divide."""
    problems = []
    if isinstance(data, BucketedData) and data.sampling != "with_replacement":
        problems.append(
            "the task's batches are made by a token budget (train.max_tokens), so their rows vary: set "
            "train.sampling: with_replacement, for batches of train.batch_size rows"
        )
    if data.batch_size % micro_batches:
        problems.append(f"train.micro_batches ({micro_batches}) must divide train.batch_size ({data.batch_size})")
    if problems:
        raise ConfigError(
            f"train.strategy pp cuts every batch into train.micro_batches equal micro-batches: {'; '.join(problems)}"
        )


class Pipeline:
    """This rank's stage of ``model`` and the schedules that run micro-batches through all stages
    (one per batch shape: a stage's buffers are sized by the first micro-batch it sees)."""

    def __init__(
        self,
        model: nn.Module,
        world: World,
        task: Pipelined[Any],
        schedule: str,
        micro_batches: int,
        device: torch.device,
    ) -> None:
        if schedule == "1f1b" and micro_batches < world.size:  # PyTorch's Schedule1F1B refuses it
            raise ConfigError(
                f"train.pipeline_schedule 1f1b needs train.micro_batches ({micro_batches}) of at least "
                f"the pipeline stages ({world.size} ranks)"
            )
        self.world, self.task, self.device = world, task, device
        self.schedule_name, self.micro_batches = schedule, micro_batches
        stages = cast(StagedModel, model).stages(world.size, task.pipeline_head)  # check_pipeline refused others
        self.stage = stages[world.rank]
        owner = {id(p): s for s, stage in enumerate(stages) for p in stage.parameters()}
        # every parameter's stage, in model order; a head the task never reads stays with the last
        self.owners = [(p, owner.get(id(p), world.size - 1)) for p in model.parameters()]
        self.schedules: dict[tuple[tuple[int, ...], ...], Any] = {}
        self.loss: Callable[[Tensor, Tensor], Tensor] | None = None  # this update's, set by accumulate_gradients

    def schedule_for(self, shape: tuple[tuple[int, ...], ...]) -> Any:  # the inputs' shapes
        if shape not in self.schedules:
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

            stage = PipelineStage(self.stage, self.world.rank, self.world.size, self.device)
            kind = ScheduleGPipe if self.schedule_name == "gpipe" else Schedule1F1B
            self.schedules[shape] = kind(
                stage,
                self.micro_batches,
                # self.loss is set (accumulate_gradients) before a step calls it
                loss_fn=lambda out, y: cast(Callable[[Tensor, Tensor], Tensor], self.loss)(out, y),
                scale_grads=False,
            )
        return self.schedules[shape]

    def run(self, inputs: tuple[Tensor, ...], targets: Tensor) -> None:
        """One batch's forward and backward through every stage, in micro-batches (every rank calls)."""
        rows = targets.shape[0]
        if rows % self.micro_batches:
            raise ConfigError(
                f"train.micro_batches ({self.micro_batches}) must divide every batch's rows (got a batch of {rows})"
            )
        schedule = self.schedule_for(tuple(tuple(x.shape) for x in inputs))
        if self.world.rank == 0:
            schedule.step(*inputs)
        elif self.world.rank == self.world.size - 1:
            schedule.step(target=targets)
        else:
            schedule.step()

    def accumulate_gradients(
        self,
        model: nn.Module,
        batches: list[Batch],
        cfg: Any,
        amp: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
        scaler: torch.amp.GradScaler | None = None,
        world: World | None = None,
        global_targets: int | None = None,
        objective: Any = None,
    ) -> dict[str, Any]:
        """train/step.py's accumulate_gradients through the pipeline: the label-smoothed loss of the
        task's targets (``piped``), each micro-batch's sum divided by the update's targets; the sums
        of the loss and the NLL on every rank."""
        if scaler is not None:
            raise ConfigError("train.strategy pp does not scale fp16 losses; use train.precision bf16 or fp32")
        self.stage.train()
        total = global_targets if global_targets is not None else sum(b.n_targets for b in batches)
        calls: list[Tensor] = []  # (2,) float64 (loss, NLL) sums, one per call of the loss on the last stage
        piped: Piped | None = None  # the batch in the pipeline, as the task feeds it

        def loss(logits: Tensor, targets: Tensor) -> Tensor:
            assert piped is not None  # the loss is called in a batch's run, after piped is set
            smoothed, nll = label_smoothed_nll(logits, targets, cfg.label_smoothing, piped.ignore_index)
            calls.append(torch.stack([smoothed.detach(), nll.detach()]).double())
            return smoothed * (1 / total)  # as accumulate_gradients scales: the same rounding

        self.loss = loss
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        with amp():
            for batch in batches:
                piped = self.task.piped(batch)
                self.run(piped.inputs, piped.targets)
                # a new stage's first step calls the loss once more, on placeholder outputs, to infer
                # the gradients' shapes (PyTorch 2.13): the micro-batches' are the last m calls
                for these in calls[-self.micro_batches :]:
                    sums = sums + these
                calls.clear()
        dist.all_reduce(sums)  # the last stage's, on every rank
        return {"loss_sum": sums[0], "nll_sum": sums[1], "targets": int(total)}

    def clip_gradients(self, parameters: list[nn.Parameter], max_norm: float) -> Tensor:
        """The L2 norm of every stage's gradients together (one all-reduce), each scaled to at most ``max_norm``."""
        grads = [p.grad for p in parameters if p.grad is not None]
        local = nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=self.device)
        square = local.double().square()
        dist.all_reduce(square)
        total = square.sqrt().float()
        nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
        return total

    def assemble(self) -> None:
        """Every stage's parameters broadcast from its rank: the whole model, trained, on every rank."""
        with torch.no_grad():
            for p, owner in self.owners:
                dist.broadcast(p.data, src=owner)

    def merged_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's state as one process over the whole model would hold it: each rank has
        the moments of its own stage's parameters only (indices are the whole model's on every rank)."""
        own = optimizer.state_dict()
        every: list[Any] = [None] * self.world.size
        dist.all_gather_object(every, own["state"])
        return own | {"state": {i: s for states in every for i, s in states.items()}}
