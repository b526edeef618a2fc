"""One optimizer update: the optimizer, the gradients of a task's loss over one or more batches
(accumulation; with several processes, this rank's share under DDP) and the step, with clipping,
mixed precision and non-finite updates skipped. ``fit`` (train/loop.py) calls ``train_step`` once
per update."""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Callable, ContextManager, cast

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP

from attnlab.errors import ConfigError
from attnlab.eval.likelihood import teacher_forced_loss
from attnlab.models.family import uncompiled, unwrapped
from attnlab.nn.embeddings import Embeddings
from attnlab.parallel.distributed import World, is_dtensor, whole
from attnlab.runs.init import LAYER
from attnlab.runs.train_config import TrainConfig
from attnlab.tasks.batching import Batch
from attnlab.torch_private import inductor_config, skips_on_device, step_unless, without_duck_sizing

Objective = Callable[..., tuple[Tensor, Tensor]]  # (model, batch, label_smoothing, amp) -> (loss, nll) sums


def compiled(objective: Objective, graphs: bool = False, varied_shapes: bool = False) -> Objective:
    """A task's loss through torch.compile, the model's forward inside it: TorchInductor fuses the
    layers' elementwise work and the loss's cast, log-sum-exp and target logit into a few kernels, so no
    float32 logits of the whole vocabulary exist (nn/losses.py).

    Batches of one shape (a language model's windows) compile static graphs, the fastest kernels;
    a batch of another shape recompiles once with dynamic sizes (TorchDynamo's default). With
    ``varied_shapes`` (examples of varied lengths under a token budget: translation, text
    classification), the sizes are dynamic from the first batch, so the run compiles one graph
    instead of two. Two sizes equal in the first batch (a source and a target both padded to 24)
    stay two symbols (no duck sizing), so a later batch where they differ does not recompile; and
    Inductor's mixed-order-reduction fusion is told not to guard on them, a guard
    (``512*B*T < 5242880``) that made PyTorch 2.11 compile the Multi30k recipe a third time on an
    H200 (docs/performance/gpu_training.md). tests/test_dropout.py counts the graphs.

    With ``graphs`` (``train.compile: graphs``, CUDA only), Inductor's "reduce-overhead" mode also
    records the compiled forward and backward as CUDA graphs and replays them: a step costs a few
    launches instead of one per kernel, which is what a small model's step is bound by. Each batch
    shape records its own graphs (and keeps their memory), so it suits fixed shapes: a language
    model's blocks, or batches padded to a few lengths (train.pad_multiple)."""
    if graphs:
        return torch.compile(objective, mode="reduce-overhead")
    if varied_shapes:
        return distinct_sizes(torch.compile(objective, dynamic=True, options=no_size_guards()))
    return torch.compile(objective)


def distinct_sizes(objective: Objective) -> Objective:
    """``objective`` traced without duck sizing: each size of a batch its own symbol, even where two
    happen to be equal."""

    @functools.wraps(objective)
    def call(*args: Any) -> tuple[Tensor, Tensor]:
        with without_duck_sizing():
            return objective(*args)

    return call


def no_size_guards() -> dict[str, str | int | bool | Callable[..., Any]]:  # torch.compile's options
    """Inductor's options that keep its mixed-order-reduction fusion from guarding on dynamic sizes,
    where this PyTorch has the switch."""
    switch = "mix_order_reduction_non_strict_mode"
    return {f"triton.{switch}": True} if hasattr(inductor_config().triton, switch) else {}


def layer_grad_norms(model: nn.Module) -> dict[str, float]:
    """The L2 norm of the gradient of each layer's parameters ('encoder.layers.0', ...), from the
    gradients as they are now (call after backward, before the optimiser zeroes them)."""
    squares: dict[str, Tensor] = {}
    for name, p in model.named_parameters():
        match = LAYER.match(name)
        if match and p.grad is not None:
            squares[match[1]] = squares.get(match[1], 0.0) + whole(p.grad.detach()).float().square().sum()
    return {layer: float(total.sqrt()) for layer, total in squares.items()}


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam(beta1, beta2, eps) (the paper: 0.9, 0.98, 1e-9), AdamW, or SGD with Nesterov momentum
    ('nag': fairseq's NAG, the same update at a constant learning rate; its weight decay, if any, is
    SGD's L2 term in the gradient, where fairseq's shrinks the weights) over the parameters that are not
    frozen; weight decay, if any, only on matrices, never on biases, LayerNorm gains or the like;
    with ``layer_lr_decay``, one group per depth, its ``lr_scale`` applied by the schedule
    (:func:`layer_lr_scales`). The update is PyTorch's fused kernel (one pass over each parameter
    instead of a dozen elementwise ops): 3.8x faster on the CPU here for the benchmark model
    (docs/performance/cpu.md), the same update to rounding (tests/test_train.py)."""
    scales = layer_lr_scales(model, cfg.layer_lr_decay)
    groups: dict[tuple[float, bool, bool], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:  # split tensors (tensor parallelism) and whole ones cannot share one fused kernel
            groups.setdefault((scales[name], p.dim() >= 2, is_dtensor(p)), []).append(p)
    # by depth, matrices first; nothing to learn: an optimizer of nothing, for the usual checkpoints
    ordered = sorted(groups.items(), key=lambda item: (item[0][0], not item[0][1], item[0][2]))
    ordered = ordered or [((1.0, True, False), [])]
    param_groups = [
        {"params": params, "weight_decay": cfg.weight_decay if matrices else 0.0, "lr_scale": scale}
        for (scale, matrices, _), params in ordered
    ]
    if cfg.optimizer == "nag":
        return torch.optim.SGD(param_groups, lr=1.0, momentum=cfg.momentum, nesterov=True)
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return cls(param_groups, lr=1.0, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=True)


def layer_depths(model: nn.Module) -> tuple[dict[str, int], int]:
    """Each parameter's depth l and the number of layers L of the deepest stack: the embeddings
    l = 0, layer i of a stack l = i + 1, what comes after the layers (heads, final norms) L + 1."""
    embeddings = [name for name, m in model.named_modules() if isinstance(m, Embeddings)]
    layer_of = {name: int(m[2]) + 1 for name, _ in model.named_parameters() if (m := LAYER.match(name))}
    top = max(layer_of.values(), default=0) + 1
    return {
        name: 0 if any(name.startswith(e + ".") for e in embeddings) else layer_of.get(name, top)
        for name, _ in model.named_parameters()
    }, top - 1


def layer_lr_scales(model: nn.Module, decay: float) -> dict[str, float]:
    """Layer-wise learning-rate decay (Clark et al. 2020, ELECTRA): a parameter at depth l of L
    (:func:`layer_depths`) learns at lr * decay^(L + 1 - l), so the heads at lr and each layer below
    by one more factor of ``decay``."""
    depths, n_layers = layer_depths(model)
    return {name: decay ** (n_layers + 1 - depth) for name, depth in depths.items()}


def freeze(model: nn.Module, embeddings: bool, first_layers: int) -> list[str]:
    """Keep the embeddings (with any output projection tied to them) and the first ``first_layers``
    layers of every stack fixed; the names of the parameters frozen."""
    depths, n_layers = layer_depths(model)
    if first_layers > n_layers:
        raise ConfigError(f"train.freeze_layers ({first_layers}) is more than the model's {n_layers} layers")
    frozen = [name for name, depth in depths.items() if (embeddings and depth == 0) or 1 <= depth <= first_layers]
    parameters = dict(model.named_parameters())
    for name in frozen:
        parameters[name].requires_grad_(False)
    return frozen


def accumulate_gradients(
    model: nn.Module,
    batches: list[Batch],
    cfg: TrainConfig,
    amp: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
    scaler: torch.amp.GradScaler | None = None,
    world: World | None = None,
    global_targets: int | None = None,
    objective: Objective = teacher_forced_loss,
) -> dict[str, Any]:
    """Backward of the ``objective`` (a task's loss) over ``batches``, summed over their targets and
    (``loss_reduction`` 'mean') divided by the number of targets of the whole (global) batch, or
    ('sum') not: Lake & Baroni's sum over a sequence's steps. With ``world``, the
    batches of every rank together (``global_targets`` when the caller knows it, as ``fit`` does:
    every rank builds the same batches; otherwise one all-reduce). DDP then averages over the
    ranks, so each rank scales by the world size: the gradients equal one process's over the
    global batch. Returns the sums of the loss and the NLL as float64 tensors on the device (summed
    over the ranks), read by no one here: the host waits for the device only when it logs them."""
    model.train()
    total: float | None = global_targets
    if total is None:
        n_targets = sum(b.n_targets for b in batches)
        total = world.all_sum(n_targets)[0] if world else n_targets
    scale = (world.size if world else 1) / (total if cfg.loss_reduction == "mean" else 1)
    # (2,) float64 on the device: the loss and NLL sums, batch after batch as the host once added them
    loss_nll: Tensor | None = None
    ddp = uncompiled(model)
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        sync = contextlib.nullcontext() if last or not isinstance(ddp, DDP) else ddp.no_sync()
        with sync:
            loss, nll = objective(model, batch, cfg.label_smoothing, amp)
            scaled = loss * scale
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        these = torch.stack([loss.detach(), nll.detach()]).double()
        loss_nll = these if loss_nll is None else loss_nll + these
    assert loss_nll is not None  # an update has at least one batch
    if world:
        loss_nll = world.all_sum_tensor(loss_nll)
    return {"loss_sum": loss_nll[0], "nll_sum": loss_nll[1], "targets": int(total)}


def train_step(
    model: nn.Module,
    batches: list[Batch],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    cfg: TrainConfig,
    amp: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
    scaler: torch.amp.GradScaler | None = None,
    layer_norms: bool = False,
    world: World | None = None,
    global_targets: int | None = None,
    objective: Objective = teacher_forced_loss,
    accumulate: Callable[..., dict[str, Any]] | None = None,
    clip: Callable[[list[nn.Parameter], float], Tensor] | None = None,
) -> dict[str, Any]:
    """One update from one or more batches (gradient accumulation; with ``world``, this rank's
    share of the global batch): the loss is the ``objective`` (a task's loss; by default the
    label-smoothed cross-entropy) summed over all targets, divided by their number. With
    ``layer_norms``, also each layer's gradient norm before clipping ('layer_grad_norms': read on
    the host, for a log step).

    The step never waits for the device: 'loss', 'nll', 'grad_norm' and 'finite' are device
    tensors, read when the loop logs. A non-finite loss or gradient norm skips the update on the
    device, as a GradScaler does: the fused optimizer leaves the weights and moments as they were
    (torch_private.py's step_unless), and 'finite' is False; the schedule moves on. With fp16 the GradScaler's own
    skips of overflowing scaled gradients are part of its calibration, and only a non-finite loss
    skips (read on the host: fp16 runs on CUDA only, under the scaler's own checks).

    ``accumulate`` and ``clip`` replace :func:`accumulate_gradients` and :func:`clip_gradients`
    where a strategy computes them its own way (a pipeline: parallel/pipeline.py)."""
    lr = max(group["lr"] for group in optimizer.param_groups)  # the heads' (layer_lr_decay gives the rest less)
    sums = (accumulate or accumulate_gradients)(model, batches, cfg, amp, scaler, world, global_targets, objective)
    if scaler is not None:
        scaler.unscale_(optimizer)
    per_layer = layer_grad_norms(unwrapped(model)) if layer_norms else None
    grad_norm = (clip or clip_gradients)(list(model.parameters()), cfg.clip_norm if cfg.clip_norm else math.inf)
    finite = torch.isfinite(sums["loss_sum"])
    if scaler is not None:
        if finite:
            scaler.step(optimizer)
            scaler.update()
    else:
        finite = finite & torch.isfinite(grad_norm)
        if skips_on_device(optimizer):  # a fused update: it skips itself where not finite
            step_unless(optimizer, ~finite)
        elif finite:  # another optimizer (a test's SGD) has no such flag: the host decides
            optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    n_targets = sums["targets"]
    out = {
        "loss": sums["loss_sum"] / n_targets,
        "nll": sums["nll_sum"] / n_targets,
        "targets": n_targets,
        "grad_norm": grad_norm,
        "lr": lr,
        "finite": finite,
    }
    return out if per_layer is None else out | {"layer_grad_norms": per_layer}


def clip_gradients(parameters: list[nn.Parameter], max_norm: float) -> Tensor:
    """Scale the gradients down to a total L2 norm of at most ``max_norm``; returns the norm before
    (a plain tensor). Split gradients (DTensors: FSDP, tensor parallelism) on different meshes and
    whole ones cannot share one foreach kernel, so where a model has several kinds (tensor
    parallelism's replicated norms and embeddings; fsdp+tp's dp, tp and 2-D meshes) each kind's norm
    is taken apart and the norms combined."""
    by_mesh: dict[Any, list[nn.Parameter]] = {}
    for p in parameters:
        if p.grad is not None:
            by_mesh.setdefault(p.grad.device_mesh if is_dtensor(p.grad) else None, []).append(p)
    kinds = list(by_mesh.values())
    if len(kinds) < 2:
        return whole(nn.utils.clip_grad_norm_(kinds[0] if kinds else [], max_norm))
    # by_mesh holds the parameters that have a gradient
    norms = [whole(nn.utils.get_total_norm(cast(list[Tensor], [p.grad for p in params]))) for params in kinds]
    total = torch.stack(norms).square().sum().sqrt()
    for params in kinds:
        nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """The saved moments and hyperparameters; how the update runs (fused or per tensor) stays this
    version's choice: a checkpoint from before the fused update records fused=None. The flags go
    into the saved groups before loading, because load_state_dict places each state's ``step`` by
    them (on the parameters' device when fused)."""
    flags = [{key: group[key] for key in ("foreach", "fused")} for group in optimizer.param_groups]
    optimizer.load_state_dict(
        state | {"param_groups": [saved | ours for saved, ours in zip(state["param_groups"], flags)]}
    )
