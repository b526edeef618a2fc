"""The train section of a config: TrainConfig, how a run trains (optimiser, schedule, budgets,
precision, compilation, strategy, checkpoints, fine-tuning), and the values its fields take."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Optional

import torch

from attnlab.config import TypedConfig, at_least, one_of
from attnlab.device import check_device_name, on_gpu
from attnlab.errors import ConfigError
from attnlab.parallel.distributed import PIPELINE_SCHEDULES, STRATEGIES
from attnlab.tasks.batching import SAMPLINGS

PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # auto: bf16 where the hardware has it natively (attnlab/precision.py)
AUTO = "auto"
OPTIMIZERS = ("adam", "adamw", "nag")  # nag: SGD with Nesterov momentum (fairseq's, for ConvS2S)
GRAPHS = "graphs"  # train.compile: compiled, each step's forward, loss and backward replayed as CUDA graphs
MAX_STEPS = 10**9  # train.max_steps: a ceiling that catches a mistyped exponent before an absurd ETA


@dataclass(frozen=True)
class TrainConfig(TypedConfig):
    """How to train: the paper's recipe by default (Adam 0.9/0.98/1e-9, the inverse-square-root
    warm-up schedule, label smoothing 0.1), with budgets in steps, epochs or seconds.

    Fine-tuning (BERT's recipe): ``init_from`` a run directory (its best checkpoint) or one of its
    checkpoint directories, whose trained weights start this run (runs/init.py); ``freeze_embeddings``
    and ``freeze_layers`` (the first k layers of every stack) keep those fixed; ``layer_lr_decay``
    xi < 1 gives layer l of L the learning rate lr * xi^(L - l) (the embeddings xi^L, the heads 1);
    ``warmup_ratio`` sets the warm-up as a fraction of max_steps instead of ``warmup_steps``.

    ``sampling``: 'epochs' passes over the training examples, batched by ``max_tokens``;
    'with_replacement' draws each batch's ``batch_size`` examples uniformly with replacement (Lake &
    Baroni 2018: one SCAN command an update), for tasks that batch examples by length (translation,
    classification, masked LM). ``loss_reduction``: the loss an update's gradient comes from, the
    mean over its target tokens, or their sum (Lake & Baroni's, from PyTorch's seq2seq tutorial: with
    one sequence an update, clipping then sees the whole sequence's gradient). ``optimizer``: Adam,
    AdamW, or 'nag', SGD with Nesterov ``momentum`` (fairseq's NAG, Gehring et al.'s optimizer)."""

    section: typing.ClassVar[str] = "train"

    seed: int = 1
    max_steps: int = 10000
    max_epochs: Optional[int] = None
    max_seconds: Optional[float] = None
    max_tokens: int = 4096
    pad_multiple: Optional[int] = None  # batches' lengths a multiple of this; None: padding_multiple decides
    batch_size: int = 32
    sampling: str = "epochs"  # epochs: each example once an epoch; with_replacement: batch_size examples drawn a batch
    accumulate: int = 1
    optimizer: str = "adam"
    lr_schedule: str = "noam"
    lr: float = 1.0
    warmup_steps: int = 4000
    min_lr: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.98
    momentum: float = 0.99  # nag's (fairseq's default)
    eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    loss_reduction: str = "mean"  # the update's loss: per target token (mean) or summed over them (sum)
    clip_norm: Optional[float] = 1.0
    precision: Optional[str] = None  # unset: auto on a GPU, fp32 on a CPU (see precision_on)
    activation_checkpointing: bool = False
    compile: bool | str = AUTO  # auto: on for CUDA, off for the CPU (see compiles_on); graphs: CUDA graphs too
    device: str = "auto"
    strategy: str = "ddp"  # under torchrun: ddp, fsdp, tp, pp or fsdp+tp (train/strategy.py)
    tensor_parallel: int = 2  # fsdp+tp: ranks per tensor-parallel group (world / this: the data-parallel size)
    pipeline_schedule: str = "1f1b"  # pp: gpipe or 1f1b (parallel/pipeline.py)
    micro_batches: int = 4  # pp: each batch cut into this many, flowing through the stages
    eval_every: int = 500
    eval_exact_match: int = 0
    early_stop_metric: str = "valid_loss"
    patience: Optional[int] = None
    keep_last: int = 3
    checkpoint_minutes: float = 10.0  # a checkpoint (not evaluated) once this long passes without one
    log_every: int = 50
    progress: bool = True
    max_bad_steps: int = 5
    init_from: Optional[str] = None
    freeze_embeddings: bool = False
    freeze_layers: int = 0
    layer_lr_decay: float = 1.0
    warmup_ratio: Optional[float] = None

    def check(self) -> None:
        one_of("optimizer", self.optimizer, OPTIMIZERS)
        one_of("sampling", self.sampling, SAMPLINGS)
        one_of("loss_reduction", self.loss_reduction, ("mean", "sum"))
        one_of("lr_schedule", self.lr_schedule, ("noam", "cosine", "constant"))
        if self.precision is not None:
            one_of("precision", self.precision, PRECISIONS)
        if isinstance(self.compile, str) and self.compile not in (AUTO, GRAPHS):
            raise ConfigError(f"compile must be true, false, auto or graphs (got {self.compile!r})")
        if self.compile == GRAPHS and self.accumulate > 1:
            raise ConfigError(
                f"train.compile 'graphs' needs accumulate 1 (got {self.accumulate}): the replayed "
                f"backward graph reuses its gradient buffers, so a second micro-batch would "
                f"overwrite the first's; use compile: true"
            )
        check_device_name(self.device)
        one_of("strategy", self.strategy, STRATEGIES)
        one_of("pipeline_schedule", self.pipeline_schedule, PIPELINE_SCHEDULES)
        for name in (
            "max_steps",
            "max_tokens",
            "batch_size",
            "accumulate",
            "micro_batches",
            "tensor_parallel",
            "eval_every",
            "keep_last",
            "log_every",
            "max_bad_steps",
        ):
            at_least(name, getattr(self, name), 1)
        if self.max_steps > MAX_STEPS:
            raise ConfigError(
                f"max_steps must be at most {MAX_STEPS:,} (got {self.max_steps:,}): more than a billion "
                f"updates is a mistyped value, not a run"
            )
        for name in ("warmup_steps", "eval_exact_match"):
            at_least(name, getattr(self, name), 0)
        for name in ("max_epochs", "patience", "pad_multiple"):
            if getattr(self, name) is not None:
                at_least(name, getattr(self, name), 1)
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(f"need 0 <= min_lr ({self.min_lr}) <= lr ({self.lr}) and lr > 0")
        if self.lr_schedule == "noam" and self.warmup_steps == 0:
            raise ConfigError("lr_schedule 'noam' needs warmup_steps >= 1")
        for name in ("beta1", "beta2", "momentum", "label_smoothing"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1) (got {getattr(self, name)})")
        if self.eps <= 0 or self.weight_decay < 0:
            raise ConfigError("eps must be > 0 and weight_decay >= 0")
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ConfigError(f"clip_norm must be > 0, or null for no clipping (got {self.clip_norm})")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ConfigError(f"max_seconds must be > 0 (got {self.max_seconds})")
        if self.checkpoint_minutes <= 0:
            raise ConfigError(
                f"checkpoint_minutes must be > 0 (got {self.checkpoint_minutes:g}): the longest a run "
                f"goes without a checkpoint to resume from"
            )
        at_least("freeze_layers", self.freeze_layers, 0)
        if not 0.0 < self.layer_lr_decay <= 1.0:
            raise ConfigError(f"layer_lr_decay must be in (0, 1] (got {self.layer_lr_decay}; 1 = no decay)")
        if self.warmup_ratio is not None:
            if not 0.0 <= self.warmup_ratio < 1.0:
                raise ConfigError(f"warmup_ratio must be in [0, 1) (got {self.warmup_ratio})")
            if self.warmup_steps != TrainConfig.warmup_steps:
                raise ConfigError(
                    f"set warmup_steps ({self.warmup_steps}) or warmup_ratio ({self.warmup_ratio}), not both"
                )
            if self.lr_schedule == "noam":
                raise ConfigError("warmup_ratio is for the cosine and constant schedules; noam takes warmup_steps")
        if (self.freeze_embeddings or self.freeze_layers) and self.init_from is None:
            raise ConfigError("freeze_embeddings and freeze_layers keep pre-trained weights fixed: they need init_from")
        if self.early_stop_metric == "exact_match" and self.eval_exact_match == 0:
            raise ConfigError("early_stop_metric 'exact_match' needs eval_exact_match > 0 (examples to decode)")

    def precision_on(self, device: torch.device) -> str:
        """The precision asked for on ``device``: ``precision``, or where it is unset, auto on a GPU
        (bf16 where it has it) and fp32 on a CPU, whose measured figures are fp32 unless a config
        asks for auto."""
        return self.precision or (AUTO if device.type == "cuda" else "fp32")

    def compiles_on(self, device: torch.device) -> bool:
        """Whether training on ``device`` goes through torch.compile: ``compile``, where auto, on CUDA
        (one graph instead of hundreds of kernel launches a step) and not on a CPU, where the
        compilation takes longer than the short runs it would speed up."""
        return device.type == "cuda" if self.compile == AUTO else bool(self.compile)

    def check_runs_on(self, device: torch.device, processes: int = 1) -> None:
        """Refuse, before a run directory is made, what ``device`` and the number of processes cannot do."""
        if self.compile == GRAPHS and device.type != "cuda":
            raise ConfigError(
                f"train.compile 'graphs' replays CUDA graphs: it needs a GPU (the run is on "
                f"{device.type}); use true or auto"
            )
        if self.compile == GRAPHS and processes > 1:
            raise ConfigError("train.compile 'graphs' is for one process; under torchrun use compile: true")

    @property
    def padding_multiple(self) -> int:
        """``pad_multiple``, or by default 8 where every new batch shape costs something (a GPU: kernel
        plans, tensor cores; train.compile: a graph) and 1 on a CPU, where padding is only extra work."""
        if self.pad_multiple is not None:
            return self.pad_multiple
        return 8 if self.compile in (True, GRAPHS) or on_gpu(self.device) else 1

    @property
    def warmup(self) -> int:
        """Warm-up updates: ``warmup_steps``, or ``warmup_ratio`` of ``max_steps``."""
        return self.warmup_steps if self.warmup_ratio is None else round(self.warmup_ratio * self.max_steps)
