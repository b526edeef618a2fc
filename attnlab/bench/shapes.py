"""Training speed at the sizes people train (issue 36): ``attnlab bench train --shape NAME``.

Each shape is one model size and the implementation a user of that size compares attnlab with,
both built at the same size and trained the same way in the same process, on the same device and
the same batches, steps interleaved (the median of each; on CUDA each timed sample is 10 steps in a row,
as a training loop runs them, the host queueing a step while the device runs the one before):

- ``gpt2-small``: decoder-only, d 768, 12 layers, 12 heads, T 1,024, V 50,257 (its table padded to
  50,304: ``embeddings.vocab_multiple`` 64, as nanoGPT pads it), GELU, pre-norm, learned positions, tied output;
  against transformers' ``GPT2LMHeadModel`` (its sdpa attention);
- ``transformer-base``: the paper's encoder-decoder, d 512, 6+6 layers, 8 heads, d_ff 2,048,
  V 32,000 shared and tied, 384 pairs of 64 + 64 tokens (24,576 of each: the paper's "about 25,000"),
  label smoothing 0.1; against ``torch.nn.Transformer`` with the same embeddings, generator and loss;
- ``bert-base``: encoder-only masked LM, d 768, 12 layers, 12 heads, T 128 (or 512), V 30,522 (padded
  to 30,528), 15% of the tokens predicted; against transformers' ``BertForMaskedLM`` (sdpa).

One step is what `attnlab train` runs (train/step.py: forward, the task's loss, backward, clipping at
1.0, the fused AdamW update); the reference's is the same with F.cross_entropy in float32. Both run
under the same autocast (``--precision``) with the same dropout; with ``--compile`` each side's
forward and loss go through torch.compile together (attnlab's as `attnlab train` compiles them);
with ``--compile graphs`` (CUDA) in Inductor's reduce-overhead mode, each side's forward, loss and
backward replayed as CUDA graphs. Each shape's records give tokens/s (the tokens a step trains on:
every target position), the ratio, the peak memory of a step on CUDA (the side's own weights and
optimizer state and what its step allocates; none with ``--compile graphs``, whose pool both sides
share), and the model-FLOPs utilisation (the budget's matrix-product FLOPs of a step,
analysis/budget.py) against the dense GEMM peak measured in the same run and against the device's
published bf16 dense peak where it is known.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Generic, Iterator, TypeVar, cast

import torch
from torch import Tensor, nn

from attnlab.analysis.budget import budget_report
from attnlab.bench.attention import measure_peak
from attnlab.bench.device import device_fields, published_bf16_peak
from attnlab.bench.reference import TRANSFORMERS_MISSING, TorchTransformer, transformers_or_none
from attnlab.bench.timing import CPU, interleaved_medians, random_pairs
from attnlab.bench.train import TrainingStep, attnlab_step, cross_entropy, gemm, mfu, reference_step
from attnlab.data.batching import Batch
from attnlab.eval.likelihood import teacher_forced_loss
from attnlab.models import build_model, model_config
from attnlab.models.shape import DataShape
from attnlab.runs.train_config import GRAPHS, TrainConfig
from attnlab.tasks.masked_lm import MaskedLMConfig, MLMBatch, mask_tokens
from attnlab.tasks.parts import Files
from attnlab.torch_private import inductor_counters
from attnlab.train.step import Objective, compiled

ShapeBatch = TypeVar("ShapeBatch", Batch, MLMBatch)  # a shape's batch: what its make_batch gives, its losses read


class Shape(Generic[ShapeBatch]):
    """A model size, its batch, and the reference implementation it is measured against."""

    name: ClassVar[str]
    reference_name: ClassVar[str]
    model: ClassVar[dict[str, Any]]  # attnlab's model section
    vocab_size: ClassVar[int]  # the data's vocabulary (models/shape.py)
    batch: ClassVar[int]
    seq_len: ClassVar[int]
    label_smoothing: ClassVar[float] = 0.0
    hf_reference: ClassVar[bool] = True  # the reference comes from transformers (left out by --no-hf)
    objective: ClassVar[Objective] = staticmethod(teacher_forced_loss)  # attnlab's loss: its task's

    def attnlab_model(self) -> nn.Module:
        return build_model(model_config(self.model), DataShape(vocab_size=self.vocab_size))

    def reference(self) -> nn.Module | None:
        """The reference model at this size (random weights), or None where its library is missing."""
        raise NotImplementedError

    def make_batch(self, batch: int, seq_len: int, generator: torch.Generator) -> ShapeBatch:
        """``batch`` random examples of ``seq_len`` tokens, on the CPU."""
        raise NotImplementedError

    def reference_loss(self, model: nn.Module, batch: ShapeBatch) -> Tensor:
        """The reference's mean loss over the targets: its logits, F.cross_entropy in float32."""
        raise NotImplementedError

    def flops(self, batch: int, seq_len: int) -> float:
        """Matrix-product FLOPs of one forward and backward (analysis/budget.py)."""
        return budget_report(model_config(self.model), DataShape(vocab_size=self.vocab_size), seq_len, batch)["flops"][
            "forward_backward"
        ]


class GPT2Small(Shape[Batch]):
    name, reference_name = "gpt2-small", "transformers.GPT2LMHeadModel"
    vocab_size = 50257
    model = dict(
        arch="decoder_lm",
        stack=dict(
            d_model=768,
            n_heads=12,
            n_layers=12,
            d_ff=3072,
            dropout=0.1,
            activation="gelu",
            norm="pre",
            layer_norm_eps=1e-5,
        ),
        positions=dict(scheme="learned", max_len=1024),
        embeddings=dict(tie="all", vocab_multiple=64),
    )
    batch, seq_len = 8, 1024

    def reference(self) -> nn.Module | None:
        if (hf := transformers_or_none()) is None:
            return None
        config = hf.GPT2Config(
            vocab_size=50257,
            n_positions=1024,
            n_embd=768,
            n_layer=12,
            n_head=12,
            activation_function="gelu",
            attn_implementation="sdpa",
        )
        return hf.GPT2LMHeadModel(config)

    def make_batch(self, batch: int, seq_len: int, generator: torch.Generator) -> Batch:
        window = torch.randint(4, self.vocab_size, (batch, seq_len + 1), generator=generator)
        return Batch(src=None, tgt_in=window[:, :-1], tgt_out=window[:, 1:])

    def reference_loss(self, model: nn.Module, batch: Batch) -> Tensor:
        return cross_entropy(model(input_ids=batch.tgt_in).logits, batch.tgt_out)


class TransformerBase(Shape[Batch]):
    name, reference_name = "transformer-base", "torch.nn.Transformer"
    vocab_size = 32000
    model = dict(
        arch="encoder_decoder",
        stack=dict(d_model=512, n_heads=8, n_layers=6, d_ff=2048, dropout=0.1, norm="post"),
        positions=dict(scheme="sinusoidal", max_len=512),
        embeddings=dict(tie="all"),
    )
    batch, seq_len, label_smoothing, hf_reference = 384, 64, 0.1, False

    def reference(self) -> nn.Module:
        s = self.model["stack"]
        return TorchTransformer(self.vocab_size, s["d_model"], s["n_heads"], s["n_layers"], s["d_ff"], s["dropout"])

    def make_batch(self, batch: int, seq_len: int, generator: torch.Generator) -> Batch:
        return random_pairs(batch, seq_len - 1, self.vocab_size, generator)  # + EOS, BOS +: seq_len each

    def reference_loss(self, model: nn.Module, batch: Batch) -> Tensor:
        return cross_entropy(model(batch.src, batch.tgt_in), batch.tgt_out, self.label_smoothing)


class BertBase(Shape[MLMBatch]):
    name, reference_name = "bert-base", "transformers.BertForMaskedLM"
    vocab_size = 30522
    model = dict(
        arch="encoder_only",
        stack=dict(
            d_model=768,
            n_heads=12,
            n_layers=12,
            d_ff=3072,
            dropout=0.1,
            activation="gelu",
            norm="post",
            layer_norm_eps=1e-12,
        ),
        positions=dict(scheme="learned", max_len=512),
        embeddings=dict(kind="normed", tie="output", vocab_multiple=64),
        n_segments=2,
    )
    batch, seq_len = 64, 128

    def reference(self) -> nn.Module | None:
        if (hf := transformers_or_none()) is None:
            return None
        return hf.BertForMaskedLM(hf.BertConfig(attn_implementation="sdpa"))

    def make_batch(self, batch: int, seq_len: int, generator: torch.Generator) -> MLMBatch:
        ids = torch.randint(5, self.vocab_size, (batch, seq_len), generator=generator)
        return mask_tokens(
            ids,
            torch.ones_like(ids, dtype=torch.bool),
            MaskedLMConfig(files=Files(train="-")),
            self.vocab_size,
            generator,
        )

    def reference_loss(self, model: nn.Module, batch: MLMBatch) -> Tensor:
        return cross_entropy(model(input_ids=batch.inputs).logits, batch.targets)

    objective = staticmethod(MaskedLMConfig(files=Files(train="-")).task.loss)


CALLS_PER_SAMPLE = {"cuda": 10}  # steps in a row in each timed sample, by device type (elsewhere 1)

SHAPES: dict[str, Shape[Any]] = {shape.name: shape() for shape in (GPT2Small, TransformerBase, BertBase)}


def shape_train_config(shape: Shape[Any], precision: str) -> TrainConfig:
    """Both sides' training settings: AdamW (weight decay 0.1 on matrices) at a constant 1e-4, clipping
    at 1, the shape's label smoothing."""
    return TrainConfig(
        optimizer="adamw",
        lr_schedule="constant",
        lr=1e-4,
        warmup_steps=1,
        weight_decay=0.1,
        label_smoothing=shape.label_smoothing,
        clip_norm=1.0,
        precision=precision,
    )


def peak_memory(step: TrainingStep, device: torch.device) -> float | None:
    """The most memory (MiB) one call of ``step`` holds on a CUDA device: its own state (weights,
    buffers, optimizer moments) and the most the call allocates above what was allocated before it.
    What the other side and the GEMM keep on the device is not counted. None off CUDA."""
    if device.type != "cuda":
        return None
    allocated = measure_peak(step, device)[1]
    return round((allocated + step.state_bytes()) / 2**20, 1)


def bench_shape(
    shape: Shape[Any],
    batch: int | None = None,
    seq_len: int | None = None,
    precision: str = "bf16",
    compile: bool | str = False,
    repeats: int = 10,
    with_hf: bool = True,
    seed: int = 0,
    device: torch.device = CPU,
) -> Iterator[dict[str, Any]]:
    """The GEMM peak of ``precision`` on ``device``, then attnlab's tokens/s at ``shape`` against its
    reference (ratio, both MFUs, both peak memories), then attnlab's MFU against the measured and
    the published peak."""
    batch, seq_len = batch or shape.batch, seq_len or shape.seq_len
    torch.manual_seed(seed)
    data = shape.make_batch(batch, seq_len, torch.Generator().manual_seed(seed)).to(device)
    tokens = batch * seq_len
    cfg = shape_train_config(shape, precision)
    models = {"attnlab": shape.attnlab_model().to(device)}
    reference = shape.reference() if with_hf or not shape.hf_reference else None
    if reference is not None:
        models[shape.reference_name] = reference.to(device)
    graphs = compile == GRAPHS  # both sides in Inductor's reduce-overhead mode, as train.compile: graphs
    skipped = inductor_counters()["cudagraph_skips"] if graphs else 0
    objective = compiled(shape.objective, graphs) if compile else shape.objective  # as `attnlab train` compiles
    reference_loss = (
        torch.compile(shape.reference_loss, mode="reduce-overhead" if graphs else "default")
        if compile
        else shape.reference_loss
    )  # its loss too
    steps = {
        name: attnlab_step(model, data, cfg, objective)
        if name == "attnlab"
        # the default binds each model (mypy cannot type a lambda with one against Callable[[], Tensor])
        else reference_step(model, cfg, cast("Callable[[], Tensor]", lambda m=model: reference_loss(m, data)))
        for name, model in models.items()
    }
    gemm_call, gemm_flops = gemm(precision, device)
    calls = CALLS_PER_SAMPLE.get(device.type, 1)
    seconds = interleaved_medians(steps | {"gemm": gemm_call}, repeats, device=device, calls=calls)
    peak = gemm_flops / seconds.pop("gemm")
    published = published_bf16_peak(device)
    flops = shape.flops(batch, seq_len)
    where = device_fields(device) | {
        "shape": shape.name,
        "batch": batch,
        "seq_len": seq_len,
        "precision": precision,
        "compiled": compile,
        "steps_per_sample": calls,
    }
    yield {"name": f"gemm_peak_{precision}", "value": round(peak / 1e9, 1), "unit": "GFLOP/s"} | where
    # replayed graphs keep their activations in one pool that both sides' graphs share: not a side's own
    memory = {name: None if graphs else peak_memory(step, device) for name, step in steps.items()}
    ours = tokens / seconds["attnlab"]
    record = {
        "name": f"train_{shape.name}",
        "value": round(ours, 1),
        "unit": "tokens/s",
        "mfu": round(mfu(flops, seconds["attnlab"], peak), 4),
        "peak_memory_mib": memory["attnlab"],
    }
    if reference is not None:
        theirs = tokens / seconds[shape.reference_name]
        record |= {
            "reference": shape.reference_name,
            "reference_value": round(theirs, 1),
            "ratio": round(ours / theirs, 3),
            "reference_mfu": round(mfu(flops, seconds[shape.reference_name], peak), 4),
            "reference_peak_memory_mib": memory[shape.reference_name],
        }
    else:
        record |= {
            "reference": shape.reference_name,
            "skipped_reference": "--no-hf" if not with_hf else TRANSFORMERS_MISSING,
        }
    if graphs:  # where Inductor could not record a graph it ran the compiled kernels instead: this counts those
        record["cudagraph_skips"] = inductor_counters()["cudagraph_skips"] - skipped
    yield record | where
    yield {
        "name": f"train_{shape.name}_mfu",
        "value": record["mfu"],
        "unit": f"fraction of the {precision} GEMM peak",
        "achieved_gflops": round(flops / seconds["attnlab"] / 1e9, 1),
        "peak_gflops": round(peak / 1e9, 1),
        "published_bf16_peak_gflops": None if published is None else round(published / 1e9, 1),
        "mfu_of_published_bf16_peak": None if published is None else round(flops / seconds["attnlab"] / published, 4),
        "flops_per_step": flops,
        "tokens_per_step": tokens,
    } | where


def check_shape_sizes(shape: Shape[Any], batch: int | None, seq_len: int | None) -> str | None:
    """Why ``--batch``/``--seq-len`` cannot be used with ``shape``; None if they can."""
    if batch is not None and batch < 1:
        return f"--batch must be at least 1 (got {batch})"
    if seq_len is not None and not 2 <= seq_len <= shape.model["positions"]["max_len"]:
        return f"--seq-len must be between 2 and {shape.name}'s {shape.model['positions']['max_len']} positions (got {seq_len})"
    return None
