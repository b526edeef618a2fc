"""The weights a trained model decodes with: ``fp32`` as trained, ``bf16`` (every floating tensor
in bfloat16), or ``int8``: dynamic quantisation of the linear layers, PyTorch's own
(``torch.ao.quantization.quantize_dynamic``): each weight matrix stored as int8 with one scale per
output channel, each input quantised on the fly, the products in int8 on the CPU's fbgemm kernels.
Every linear map is int8, the output projection (``generator``, a :class:`VocabularyProjection`)
included, as :class:`Int8VocabularyProjection` (the same per-row scales, its padding rows cut off
and its never-output tokens at -inf as before). Embeddings, norms and the attention arithmetic
stay in float32; in the tied models the embedding table stays float32 and the projection gets an
int8 copy of it.

Why the output projection too (issue 63): it is a decoding step's largest product (V x d_model, 8 MB
in float32 at the bench's shape, read once a step), and CTranslate2's int8, the bar, quantises it.
Left in float32 it held greedy at batch 32 to 1.33x fp32 instead of 1.86x
(docs/experiments/int8_output_projection.py). Its price: on Multi30k (docs/results/decoding.md) int8 with it
cost 0.38 BLEU with beam 4 (0.20 without it) against the issue's bar of 0.3.

Why this tool: torchao (0.18), the library PyTorch points to, has on this CPU no fast int8 kernel:
its weight-only int8 linear ran at fp32's speed and its dynamic int8 one 20 times slower, while
quantize_dynamic ran 2-3 times faster than fp32 (a 512 -> 2048 -> 512 MLP, batch 32, one thread,
measured 2026-11-23 on the 2-core machine of docs/results/index.md, with other jobs running). PyTorch
marks torch.ao.quantization and its quantized tensors deprecated (torch 2.13 still ships and runs
them); the warnings are silenced here, and the choice is to revisit when torchao gains CPU kernels.

A model with such weights is also stored (``attnlab export``, runs/derived.py): :func:`stored_state`
gives its tensors as a safetensors file holds them, :func:`load_stored_state` puts them back into a
model that :func:`with_weights` has converted the same way, so the loaded model computes exactly
what the converted one did.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator

import torch
from torch import nn

from attnlab.nn.heads import VocabularyProjection, vocabulary_logits
from attnlab.torch_private import per_channel_quantized

WEIGHTS = ("fp32", "bf16", "int8")

# How a file holds each kind of weights (the metadata of an exported file says it; fp32 is a model's
# own state dict).
LAYOUTS = {
    "bf16": "every floating tensor in bfloat16",
    "int8": "each linear layer NAME, the output projection (generator) included, quantised per output channel, "
    "symmetrically (zero points 0): NAME.weight int8 (out, in), NAME.weight_scale float32 (out,), weight = "
    "int8 value x scale; NAME.bias float32; inputs quantised on the fly (torch.ao dynamic quantisation); "
    "every other tensor float32",
}


def with_weights(model: nn.Module, weights: str) -> nn.Module:
    """``model`` (in eval mode) converted in place to ``weights``; int8 only on the CPU. A model
    converted already (or loaded from an export) is only ever asked for its own kind: it stays as it is."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)} (got {weights!r})")
    held = weights_of(model)
    if held == weights:
        return model
    if held != "fp32":
        raise ValueError(
            f"the model's weights are {held} already (a run exported with them), and do not become "
            f"{weights}; leave --weights out"
        )
    if weights == "bf16":
        return model.to(torch.bfloat16)
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ValueError(f"int8 weights run on the CPU's kernels, and this model is on '{device}'; use bf16 there")
    with _quiet():
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        quantize: Callable[..., nn.Module] = quantize_dynamic  # unannotated in torch
        projections = _vocabulary_projections(model)  # quantize_dynamic swaps plain nn.Linear only
        layers = {name: per_channel_dynamic_qconfig for name in quantised_layers(model)}
        model = quantize(model, layers, dtype=torch.qint8, inplace=True)
        for (parent, attr), projection in projections.items():
            setattr(parent, attr, projection)
        return model


def quantised_layers(model: nn.Module) -> list[str]:
    """The names of the plain linear layers that quantize_dynamic swaps for int8 ones (the
    vocabulary projections, a subclass, are :func:`_vocabulary_projections`'s)."""
    return [name for name, m in model.named_modules() if type(m) is nn.Linear]


def _vocabulary_projections(model: nn.Module) -> dict[tuple[nn.Module, str], nn.Module]:
    """(parent, attribute) -> the int8 copy of each VocabularyProjection that ``model`` holds; one
    copy per projection, wherever it is held (a multi-token model's heads share its generator)."""
    copies: dict[int, nn.Module] = {}
    places = {}
    for parent in model.modules():
        for attr, child in parent.named_children():
            if isinstance(child, VocabularyProjection):
                if id(child) not in copies:
                    copies[id(child)] = Int8VocabularyProjection.of(child)
                places[(parent, attr)] = copies[id(child)]
    return places


def weights_of(model: nn.Module) -> str:
    """What :func:`with_weights` made of ``model``: 'int8' (it has int8 linear layers), 'bf16' or 'fp32'."""
    if _int8_linears(model):
        return "int8"
    return "bf16" if any(p.dtype == torch.bfloat16 for p in model.parameters()) else "fp32"


def stored_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state as plain tensors, which a safetensors file can hold (LAYOUTS): its state
    dict, where each int8 linear layer NAME gives, instead of torch's packed parameters, NAME.weight
    (out, in) int8, NAME.weight_scale (out,) float32 (the scheme is symmetric: no zero points) and
    NAME.bias (out,) if it has one."""
    linears = _int8_linears(model)
    packed = tuple(f"{name}." for name in linears)
    state = {name: t for name, t in model.state_dict().items() if not name.startswith(packed)}
    for name, linear in linears.items():
        weight, bias = linear.weight(), linear.bias()
        state[f"{name}.weight"] = weight.int_repr()
        state[f"{name}.weight_scale"] = weight.q_per_channel_scales().float()  # float32 scales, held as float64
        if bias is not None:
            state[f"{name}.bias"] = bias.detach()
    return state


def load_stored_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put ``state``, every tensor :func:`stored_state` names for ``model`` and nothing else, into
    ``model``, whose weights are of the kind the state holds (:func:`with_weights`)."""
    rest = dict(state)
    linears = _int8_linears(model)
    with _quiet():
        for name, linear in linears.items():
            scales = rest.pop(f"{name}.weight_scale").double()  # (out,)
            weight = per_channel_quantized(rest.pop(f"{name}.weight"), scales)
            linear.set_weight_bias(weight, rest.pop(f"{name}.bias", None))
    own = model.state_dict()  # the int8 layers' entries as just set, with torch's metadata (their version)
    own.update(rest)
    model.load_state_dict(own)


def _dynamic_linear() -> type[Any]:
    """torch.ao's int8 linear layer (imported on first use, silenced; its methods are unannotated)."""
    with _quiet():
        from torch.ao.nn.quantized.dynamic import Linear
    return Linear


class Int8VocabularyProjection(nn.Module):
    """A :class:`VocabularyProjection` (d_model -> V over ``rows`` >= V rows) with int8 weights: the
    rows quantised symmetrically with one scale per row (per output channel, the scheme of every
    other int8 layer here), each input quantised on the fly, the product in int8 (fbgemm); then,
    as in float32, the padding rows cut off and the never-output tokens at -inf. ``linear`` holds
    the int8 layer, so an export stores it as ``generator.linear.weight`` and ``.weight_scale``."""

    excluded: torch.Tensor | None  # a buffer (register_buffer)

    def __init__(self, linear: nn.Module, vocab_size: int, excluded: torch.Tensor | None) -> None:
        super().__init__()
        self.linear = linear
        self.vocab_size = vocab_size
        self.register_buffer("excluded", excluded, persistent=False)  # (V,) or None

    @classmethod
    def of(cls, projection: VocabularyProjection) -> "Int8VocabularyProjection":
        """The int8 copy of ``projection``: its weight quantised as quantize_dynamic quantises every
        other linear layer (torch.ao's per-channel observer: symmetric, scale = max |row| / 127.5)."""
        from torch.ao.quantization import per_channel_dynamic_qconfig

        with _quiet():
            observer = per_channel_dynamic_qconfig.weight()
            weight = projection.weight.detach().float()
            observer(weight)
            scales, zero_points = observer.calculate_qparams()
            int8 = torch.quantize_per_channel(weight, scales.double(), zero_points.long(), 0, torch.qint8)
            linear = _dynamic_linear()(projection.in_features, projection.out_features, dtype=torch.qint8)
            bias = None if projection.bias is None else projection.bias.detach().float()
            linear.set_weight_bias(int8, bias)
        excluded = projection.excluded  # a buffer: (V,) or None
        assert excluded is None or isinstance(excluded, torch.Tensor)
        return cls(linear, projection.vocab_size, excluded)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(..., d_model) -> (..., V) logits."""
        return vocabulary_logits(self.linear(h), self.vocab_size, self.excluded)


def _int8_linears(model: nn.Module) -> dict[str, Any]:
    """The int8 linear layers of ``model``, by name."""
    linear = _dynamic_linear()
    return {name: m for name, m in model.named_modules() if isinstance(m, linear)}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the deprecation warnings of torch.ao.quantization and of quantized tensors."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*", category=UserWarning)
        yield
