"""Where a model's parameters are: by component (embeddings, encoder, decoder, heads), by kind
(attention, feed-forward, norm, positional) and per layer. Tied parameters are counted once, at
their first owner in module order (the token embedding)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torch import nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.feedforward import PositionWiseFeedForward
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.transformer import Embeddings


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
        kind = next((k for i in range(len(parts), 0, -1)
                     if (k := _kind(".".join(parts[:i]), modules[".".join(parts[:i])])) is not None), "other")
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
