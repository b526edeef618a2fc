"""Where a model's parameters are: by component (embeddings, encoder, decoder, heads), by kind
(attention, feed-forward, norm, positional) and per layer. Tied parameters are counted once, at
their first owner in module order (the token embedding)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from attnlab.models.shape import DataShape
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.embeddings import Embeddings
from attnlab.nn.feedforward import PositionWiseFeedForward
from attnlab.nn.interfaces import Classifier, CTCModel, EncodingModel, Seq2SeqModel
from attnlab.nn.positional import PositionalEncoding


def _kind(path: str, module: nn.Module) -> str | None:
    """The kind a module's parameters count as, or None to look at an outer module."""
    if isinstance(module, PositionalEncoding):
        return "positional"
    if isinstance(module, MultiHeadAttention):
        return "cross_attention" if path.endswith("cross_attn") else "self_attention"
    if isinstance(module, PositionWiseFeedForward):
        return "feed_forward"
    if isinstance(module, nn.LayerNorm):
        return "norm"
    if isinstance(module, Embeddings):
        return "embedding"
    return None


def parameter_report(model: nn.Module) -> dict[str, Any]:
    """{'params_total', 'components': {name: n}, 'kinds': {kind: n}, 'layers': {path: {kind: n}}}.

    Components are the model's top-level children; kinds are the innermost named part owning a
    parameter (other parameters, such as the heads' own linear maps, count as 'other')."""
    modules = dict(model.named_modules())
    components: dict[str, int] = defaultdict(int)
    kinds: dict[str, int] = defaultdict(int)
    layers: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for name, param in model.named_parameters():  # each Parameter once, even when tied
        parts = name.split(".")[:-1]
        kind = next(
            (
                k
                for i in range(len(parts), 0, -1)
                if (k := _kind(".".join(parts[:i]), modules[".".join(parts[:i])])) is not None
            ),
            "other",
        )
        n = param.numel()
        components[parts[0] if parts else name] += n
        kinds[kind] += n
        if "layers" in parts:
            layers[".".join(parts[: parts.index("layers") + 2])][kind] += n
    return {
        "params_total": sum(components.values()),
        "components": dict(components),
        "kinds": dict(kinds),
        "layers": {path: dict(counts) for path, counts in layers.items()},
    }


def format_parameter_report(report: dict[str, Any]) -> str:
    """A plain-text table of :func:`parameter_report`, layers with identical counts folded."""
    lines = [f"{'parameters':<28}{report['params_total']:>14,}", "", "by component"]
    lines += [f"  {name:<26}{n:>14,}" for name, n in report["components"].items()]
    lines += ["", "by kind"]
    lines += [f"  {kind:<26}{n:>14,}" for kind, n in report["kinds"].items()]
    lines += ["", "per layer"]
    for paths, counts in _fold_layers(report["layers"]):
        label = paths[0] if len(paths) == 1 else f"{paths[0]}-{paths[-1].rsplit('.', 1)[1]}"
        each = "" if len(paths) == 1 else " each"
        detail = ", ".join(f"{kind} {n:,}" for kind, n in counts.items())
        lines.append(f"  {label:<26}{sum(counts.values()):>14,}{each}  ({detail})")
    return "\n".join(lines)


def _fold_layers(layers: dict[str, dict[str, int]]) -> list[tuple[list[str], dict[str, int]]]:
    """Runs of consecutive layers of one stack with the same counts, as ([paths], counts)."""
    runs: list[tuple[list[str], dict[str, int]]] = []
    for path, counts in layers.items():
        stack = path.rsplit(".", 1)[0]
        if runs and runs[-1][1] == counts and runs[-1][0][-1].rsplit(".", 1)[0] == stack:
            runs[-1][0].append(path)
        else:
            runs.append(([path], counts))
    return runs


# -- compute and memory, measured on the meta device ---------------------------------------------
#
# The model runs once, forward and backward, on PyTorch's "meta" device: tensors with shapes and
# no data, so a 213M-parameter model at T = 512 costs no memory and no time. FLOPs are counted by
# torch.utils.flop_counter (2 per multiply-add, matrix products only), and attributed to the module
# that ran them in the forward pass; the activation memory is what autograd saves for the backward
# (saved_tensors_hooks), the figures of *this* implementation, not a formula.


def _inputs(cfg: Any, batch: int, seq_len: int, src_len: int) -> tuple[Tensor, ...]:
    def ids(n: int) -> Tensor:  # (batch, n) of id 1: no padding
        return torch.ones(batch, n, dtype=torch.long)

    seq2seq = cfg.capabilities.encoder and cfg.capabilities.decoder
    return (ids(src_len), ids(seq_len)) if seq2seq else (ids(seq_len),)


def _flop_kind(module: str) -> str | None:
    """'attention_projections', 'attention_scores' (Q K^T and the weighted sum of V), 'feed_forward',
    'output' (the vocabulary projection), or None for an outer module."""
    parts = module.split(".")
    if parts[-1] in ("self_attn", "cross_attn"):
        return "attention_scores"  # what the attention module runs outside its projections
    if len(parts) >= 2 and parts[-2] in ("self_attn", "cross_attn") and parts[-1].endswith("_proj"):
        return "attention_projections"
    if parts[-1] == "feed_forward":
        return "feed_forward"
    if parts[-1] in ("generator", "mlm_head", "classifier", "output"):  # output: a CTC recogniser's
        return "output"
    return None


def _by_kind(forward: dict[str, int]) -> dict[str, int]:
    """FLOPs by module path -> by _flop_kind (each module once: an attention module's own total less
    its projections, which are counted apart)."""
    by_kind = dict.fromkeys(("attention_projections", "attention_scores", "feed_forward", "output"), 0)
    for name, flops in forward.items():
        kind = _flop_kind(name)
        if kind == "attention_scores":
            flops -= sum(f for child, f in forward.items() if child.startswith(name + ".") and child.endswith("_proj"))
        if kind is not None:
            by_kind[kind] += flops
    return by_kind


def budget_report(
    cfg: Any, shape: DataShape, seq_len: int, batch: int, src_len: int | None = None, bytes_per_value: int = 4
) -> dict[str, Any]:
    """FLOPs (forward by kind, and forward + backward in all), training memory (weights, gradients,
    Adam's two moments, activations saved for the backward, of which attention matrices) and
    inference memory with a KV cache, for a batch of ``batch`` sequences of ``seq_len`` tokens
    (and sources of ``src_len``, default ``seq_len``) through the model of ``cfg`` and the data's
    sizes ``shape``."""
    from attnlab.models import build_model

    if not cfg.capabilities.attention_weights:
        raise ValueError(f"the compute and memory budget covers the Transformer architectures, not arch '{cfg.arch}'")
    src_len = src_len or seq_len
    with torch.device("meta"):
        model = build_model(cfg, shape).train()
        inputs = _inputs(cfg, batch, seq_len, src_len)
    n_params = sum(p.numel() for p in model.parameters())
    params = {id(p) for p in model.parameters()}
    saved: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(base) not in params and t.is_floating_point():
            saved[id(base)] = base  # each storage once, however many ops save it
        return t

    counter = FlopCounterMode(display=False, depth=100)
    with counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(*inputs)
        forward = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
        logits.float().sum().backward()
    total = sum(counter.get_flop_counts()["Global"].values())
    by_kind = _by_kind(forward)
    activation_bytes = sum(t.numel() for t in saved.values()) * bytes_per_value
    attention_bytes = (
        sum(
            t.numel()
            for t in saved.values()
            if t.dim() == 4
            and t.shape[1] == cfg.stack.n_heads
            and t.shape[-1] in (seq_len, src_len)
            and t.shape[-2] in (seq_len, src_len)
        )
        * bytes_per_value
    )
    weights = n_params * bytes_per_value
    seq2seq = cfg.capabilities.encoder and cfg.capabilities.decoder
    cache_layers = cfg.decoder_layers if cfg.capabilities.incremental_decoding else 0
    kv_cache = 2 * cache_layers * batch * seq_len * cfg.stack.d_model * bytes_per_value  # self-attention K and V
    if seq2seq:
        kv_cache += 2 * cfg.decoder_layers * batch * src_len * cfg.stack.d_model * bytes_per_value  # projected source
    return {
        "batch": batch,
        "seq_len": seq_len,
        "src_len": src_len if seq2seq else None,
        "bytes_per_value": bytes_per_value,
        "params": n_params,
        "flops": {"forward": sum(by_kind.values()), "forward_by_kind": by_kind, "forward_backward": total},
        "training_memory": {
            "weights": weights,
            "gradients": weights,
            "adam_moments": 2 * weights,
            "activations": activation_bytes,
            "of_which_attention_matrices": attention_bytes,
            "total": 4 * weights + activation_bytes,
        },
        "inference_memory": {"weights": weights, "kv_cache": kv_cache, "total": weights + kv_cache},
    }


def format_budget_report(report: dict[str, Any]) -> str:
    def gib(n: float) -> str:
        return f"{n / 2**30:,.3f} GiB"

    src = f", sources of {report['src_len']}" if report["src_len"] else ""
    lines = [
        f"budget for a batch of {report['batch']} x {report['seq_len']} tokens{src}, "
        f"{report['bytes_per_value']} bytes per value (measured on the meta device)",
        "",
    ]
    if "flops" in report:
        flops = report["flops"]
        lines.append("FLOPs (2 per multiply-add)")
        for kind, n in flops["forward_by_kind"].items():
            lines.append(f"  forward {kind:<24}{n:>22,}  ({n / max(flops['forward'], 1):6.1%})")
        lines.append(f"  forward total{'':<18}{flops['forward']:>22,}")
        lines.append(f"  forward + backward{'':<13}{flops['forward_backward']:>22,}")
    for key, title in (("training_memory", "training memory"), ("inference_memory", "inference memory (KV cache)")):
        if key in report:
            lines += ["", title] + [f"  {k:<30}{gib(v):>16}" for k, v in report[key].items()]
    return "\n".join(lines)


class _Listening(nn.Module):
    """A sound model reading one clip as it does in use, so that FlopCounterMode names its modules by
    their path: a classifier's ``classify``, a CTC recogniser's ``ctc_log_probs``, an encoder-decoder's
    ``encode`` (the transcript's decoder steps, one per output token, are not a cost per second of audio).
    ``forward`` returns a recogniser's (B, T, ...) states, T the tokens it reads (None for a classifier,
    whose ``encode`` says them: :func:`sound_report`)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, waveforms: Tensor, lengths: Tensor) -> Tensor | None:
        model = self.model
        if isinstance(model, Classifier):
            model.classify(waveforms, lengths)
            return None
        if isinstance(model, CTCModel):
            return model.ctc_log_probs(waveforms)[0]  # (B, T, V)
        if isinstance(model, Seq2SeqModel):
            return model.encode(waveforms)[0]  # (B, T, d_model): the memory the decoder reads
        raise TypeError(f"{type(model).__name__} reads waveforms but neither classifies nor transcribes them")


def sound_report(cfg: Any, shape: DataShape, seconds: float = 1.0) -> dict[str, Any]:
    """What ``seconds`` of audio cost a model that reads waveforms: the tokens its encoder reads (a class
    token included; None for a model without tokens, a CNN) and the forward FLOPs (2 per multiply-add)
    by kind, the front end (features, stem, token maps) as the rest; a recogniser's encoder alone (an
    encoder-decoder's decoder runs once per output token). Measured on the meta device, in eval mode,
    for one clip of that length."""
    from attnlab.models import build_model

    rate = shape.need("sample_rate", f"arch '{cfg.arch}'")
    samples = max(1, round(seconds * rate))
    with torch.device("meta"):
        model = build_model(cfg, dataclasses.replace(shape, samples=samples)).eval()
        waveforms, lengths = torch.zeros(1, samples), torch.full((1,), samples)
    counter = FlopCounterMode(display=False, depth=100)
    with torch.no_grad(), counter:
        states = _Listening(model)(waveforms, lengths)
    forward = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    by_kind = _by_kind(forward)
    total = forward.get("Global", 0)
    tokens = None if states is None else states.shape[1]
    if isinstance(model, Classifier) and isinstance(model, EncodingModel):  # the whole clip is valid
        with torch.no_grad():
            tokens = model.encode(waveforms, lengths)[1].shape[1]
    return {
        "seconds": seconds,
        "sample_rate": rate,
        "tokens": tokens,
        "forward_flops": total,
        "forward_by_kind": {**by_kind, "front_end": total - sum(by_kind.values())},
    }


def format_sound_report(report: dict[str, Any]) -> str:
    per = f"per {report['seconds']:g} s of audio at {report['sample_rate']:,} Hz (counted on the meta device)"
    tokens = "none (no tokens)" if report["tokens"] is None else f"{report['tokens']:,}"
    lines = [per, f"  {'tokens':<24}{tokens:>16}", f"  {'forward FLOPs':<24}{report['forward_flops']:>16,}"]
    lines += [f"    {kind:<22}{flops:>16,}" for kind, flops in report["forward_by_kind"].items()]
    return "\n".join(lines)
