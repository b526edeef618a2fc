"""Pipeline parallelism with PyTorch's own engine, ``torch.distributed.pipelining``: rank s of N
holds stage s, a run of consecutive layers of a decoder-only model (the first stage also the
embeddings, the last the final norm and the output projection), and each batch flows through the
stages cut into ``train.micro_batches`` micro-batches, as ``train.pipeline_schedule`` orders them:

    gpipe  every micro-batch's forward, then every backward (Huang et al. 2019)
    1f1b   after a warm-up, one forward and one backward in turn, so that a stage keeps at most N
           micro-batches' activations instead of m (PipeDream-Flush, Narayanan et al. 2021)

Either way a stage waits (N - 1) of the (m + N - 1) micro-batch slots of a step: the bubble,
(N - 1) / (m + N - 1) (docs/performance.md measures it). Each micro-batch's loss is its sum over
target tokens divided by the tokens of the whole update, so the gradients are one process's over
the same micro-batches accumulated.

Every rank keeps the whole model object, training its own stage's parameters only; before an
evaluation or a checkpoint each stage broadcasts its parameters (``assemble``), so that validation
and the weights file see the whole model, and the optimizer states of the stages are merged into
the one a single process would have (it resumes under any strategy that keeps them whole).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

import torch
import torch.distributed as dist
from torch import Tensor, nn

from attnlab.data.tokenizers import PAD
from attnlab.errors import ConfigError
from attnlab.nn.losses import label_smoothed_nll
from attnlab.nn.stacks import Decoder
from attnlab.train.distributed import World


def check_pipeline(model_cfg: Any, stages: int) -> None:
    """Refuse in one line a model that cannot be cut into ``stages`` pipeline stages here."""
    if model_cfg.arch != "decoder_lm":
        raise ConfigError(f"train.strategy pp cuts a decoder-only model (model.arch decoder_lm) into stages; "
                          f"model.arch is '{model_cfg.arch}'")
    if model_cfg.stack.n_layers < stages:
        raise ConfigError(f"train.strategy pp: model.stack.n_layers ({model_cfg.stack.n_layers}) is fewer than the pipeline "
                          f"stages ({stages} ranks)")
    if model_cfg.tie_embeddings != "none":
        raise ConfigError(f"train.strategy pp: model.tie_embeddings '{model_cfg.tie_embeddings}' shares the first "
                          f"stage's embedding with the last stage's output projection; set it to none")
    if model_cfg.multi_token_heads:
        raise ConfigError("train.strategy pp: model.multi_token_heads are not cut into stages; set it to 0")


def stage_layers(n_layers: int, stages: int, stage: int) -> range:
    """The layers of ``stage``: consecutive, the first ``n_layers % stages`` stages one more."""
    size, extra = divmod(n_layers, stages)
    start = stage * size + min(stage, extra)
    return range(start, start + size + (stage < extra))


class LMStage(nn.Module):
    """Layers ``layers`` of a DecoderLM (its own modules, shared): (B, T) ids on the first stage, or
    (B, T, d_model) states -> (B, T, d_model) states, or (B, T, V) logits on the last."""

    def __init__(self, model: nn.Module, layers: range) -> None:
        super().__init__()
        first, last = layers.start == 0, layers.stop == len(model.decoder.layers)
        self.embed = model.embed if first else None
        self.decoder = Decoder([model.decoder.layers[i] for i in layers], model.decoder.norm if last else nn.Identity())
        self.generator = model.generator if last else None

    def forward(self, x: Tensor) -> Tensor:
        positions = torch.arange(x.shape[1], device=x.device)
        if self.embed is not None:
            x = self.embed(x, positions)  # (B, T) -> (B, T, d_model)
        # a causal decoder masks no padding (Decoder.keys_to_mask): the states need no ids
        x = self.decoder(x, torch.ones(x.shape[:2], dtype=torch.bool, device=x.device), positions)
        return x if self.generator is None else self.generator(x)


class Pipeline:
    """This rank's stage of ``model`` and the schedules that run micro-batches through all stages
    (one per batch shape: a stage's buffers are sized by the first micro-batch it sees)."""

    def __init__(self, model: nn.Module, world: World, schedule: str, micro_batches: int,
                 device: torch.device) -> None:
        if schedule == "1f1b" and micro_batches < world.size:  # PyTorch's Schedule1F1B refuses it
            raise ConfigError(f"train.pipeline_schedule 1f1b needs train.micro_batches ({micro_batches}) of at least "
                              f"the pipeline stages ({world.size} ranks)")
        self.world, self.schedule_name, self.micro_batches, self.device = world, schedule, micro_batches, device
        n_layers = len(model.decoder.layers)
        self.stage = LMStage(model, stage_layers(n_layers, world.size, world.rank))
        owner = {id(p): s for s in range(world.size)
                 for p in LMStage(model, stage_layers(n_layers, world.size, s)).parameters()}
        self.owners = [(p, owner[id(p)]) for p in model.parameters()]  # every parameter's stage, in model order
        self.schedules: dict[tuple[int, ...], Any] = {}
        self.loss: Callable[[Tensor, Tensor], Tensor] | None = None  # this update's, set by accumulate_gradients

    def schedule_for(self, shape: torch.Size) -> Any:
        if tuple(shape) not in self.schedules:
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

            stage = PipelineStage(self.stage, self.world.rank, self.world.size, self.device)
            kind = ScheduleGPipe if self.schedule_name == "gpipe" else Schedule1F1B
            self.schedules[tuple(shape)] = kind(stage, self.micro_batches, loss_fn=lambda out, y: self.loss(out, y),
                                                scale_grads=False)
        return self.schedules[tuple(shape)]

    def run(self, ids: Tensor, targets: Tensor) -> None:
        """One batch's forward and backward through every stage, in micro-batches (every rank calls)."""
        if ids.shape[0] % self.micro_batches:
            raise ConfigError(f"train.micro_batches ({self.micro_batches}) must divide every batch's rows "
                              f"(got a batch of {ids.shape[0]})")
        schedule = self.schedule_for(ids.shape)
        if self.world.rank == 0:
            schedule.step(ids)
        elif self.world.rank == self.world.size - 1:
            schedule.step(target=targets)
        else:
            schedule.step()

    def accumulate_gradients(self, model: nn.Module, batches: list, cfg: Any,
                             amp: Callable[[], ContextManager] = contextlib.nullcontext,
                             scaler: torch.amp.GradScaler | None = None, world: World | None = None,
                             global_targets: int | None = None, objective: Any = None) -> dict[str, Any]:
        """train/step.py's accumulate_gradients through the pipeline: the label-smoothed loss of the
        next tokens, each micro-batch's sum divided by the update's target tokens; the sums of the
        loss and the NLL on every rank."""
        if scaler is not None:
            raise ConfigError("train.strategy pp does not scale fp16 losses; use train.precision bf16 or fp32")
        self.stage.train()
        total = global_targets if global_targets is not None else sum(b.n_targets for b in batches)
        calls: list[Tensor] = []  # (2,) float64 (loss, NLL) sums, one per call of the loss on the last stage

        def loss(logits: Tensor, targets: Tensor) -> Tensor:
            smoothed, nll = label_smoothed_nll(logits, targets, cfg.label_smoothing, PAD)
            calls.append(torch.stack([smoothed.detach(), nll.detach()]).double())
            return smoothed * (1 / total)  # as accumulate_gradients scales: the same rounding

        self.loss = loss
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        with amp():
            for batch in batches:
                self.run(batch.tgt_in, batch.tgt_out)
                # a new stage's first step calls the loss once more, on placeholder outputs, to infer
                # the gradients' shapes (PyTorch 2.13): the micro-batches' are the last m calls
                for these in calls[-self.micro_batches:]:
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
