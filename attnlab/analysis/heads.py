"""What each attention head does, and which ones matter.

- ``head_entropy``: the mean entropy (nats) of each head's distribution over keys; log(Tk) is
  uniform, 0 is one-hot (Voita et al. 2019 and the notes' "entropy collapse" use it).
- ``mean_distance``: the mean |i - j| each head attends over, weighted by its probabilities.
- ``attention_rollout``: Abnar & Zuidema (2020): how much each input position reaches each output
  through every layer's attention and residual path.
- ``head_importance``: Michel et al. (2019): a gate xi_h = 1 multiplies each head's output;
  I_h = E |dL / d xi_h| over the data, normalised per layer (their eq. 2 and section 4.1).
- ``mask_heads``: pruning by gating heads to zero; ``nn.attention.remove_heads`` cuts their weights
  out instead (``MultiHeadAttention.prune_heads``); the two compute the same function.
- ``prune_order``: heads from least to most important across the whole model, never the last
  head of a layer.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import Tensor, nn

from attnlab.nn.attention import HeadSet, attention_modules


def head_entropy(probs: Tensor, query_valid: Tensor | None = None) -> Tensor:
    """(B, H, Tq, Tk) weights -> (H,) mean entropy in nats over the valid queries (B, Tq)."""
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1)  # (B, H, Tq)
    return _mean_over_queries(entropy, query_valid)


def mean_distance(probs: Tensor, q_pos: Tensor, k_pos: Tensor, query_valid: Tensor | None = None) -> Tensor:
    """(B, H, Tq, Tk) weights at (Tq,), (Tk,) positions -> (H,) mean attended distance sum_j p_ij |i - j|."""
    distance = (k_pos[None, :] - q_pos[:, None]).abs().to(probs.dtype)  # (Tq, Tk)
    return _mean_over_queries((probs * distance).sum(-1), query_valid)


def attention_rollout(layers: Iterable[Tensor]) -> Tensor:
    """Abnar & Zuidema (2020): each layer's (B, H, T, T) weights, first layer first -> (B, T, T).

    Per layer, A = mean over heads, plus the identity for the residual path, rows renormalised:
    A' = (A + I) / rowsum(A + I) (= (A + I) / 2, as A's rows sum to 1). The rollout is the product
    from the last layer down, R = A'_L ... A'_2 A'_1: row i is how output i mixes the inputs."""
    rollout = None
    for probs in layers:
        mixed = probs.float().mean(1)  # (B, T, T): heads averaged
        mixed = mixed + torch.eye(mixed.shape[-1], device=mixed.device)  # the residual connection
        mixed = mixed / mixed.sum(-1, keepdim=True)  # rows sum to 1 again
        rollout = mixed if rollout is None else mixed @ rollout  # (B, T, T)
    if rollout is None:
        raise ValueError("attention_rollout needs at least one layer's weights")
    return rollout


def _mean_over_queries(per_query: Tensor, query_valid: Tensor | None) -> Tensor:
    """(B, H, Tq) -> (H,): the mean over batch and queries, padding queries excluded."""
    if query_valid is None:
        return per_query.mean(dim=(0, 2))
    weight = query_valid[:, None, :].to(per_query.dtype)  # (B, 1, Tq)
    return (per_query * weight).sum(dim=(0, 2)) / weight.sum().clamp_min(1)


def head_importance(
    model: nn.Module, batches: Iterable[object], loss_of: Callable[[nn.Module, object], Tensor], normalise: bool = True
) -> dict[str, Tensor]:
    """I_h = sum over batches of |dL/d xi_h| for a gate xi_h = 1 on every head, per module (H,);
    with ``normalise``, divided by the layer's L2 norm (Michel et al. 2019). ``loss_of(model,
    batch)`` is the loss to differentiate (the mean NLL per token, say). Weights are untouched."""
    modules = attention_modules(model)
    device = next(model.parameters()).device
    gates = {name: torch.ones(m.n_heads, device=device, requires_grad=True) for name, m in modules.items()}
    importance = {name: torch.zeros(m.n_heads, device=device) for name, m in modules.items()}
    requires = [p.requires_grad for p in model.parameters()]
    was_training = model.training
    model.eval()
    try:
        for p in model.parameters():
            p.requires_grad_(False)  # only the gates need gradients
        for name, module in modules.items():
            module.head_gate = gates[name]
        for batch in batches:
            grads = torch.autograd.grad(loss_of(model, batch), list(gates.values()))
            for name, g in zip(gates, grads):
                importance[name] += g.abs()
    finally:
        for p, r in zip(model.parameters(), requires):
            p.requires_grad_(r)
        for module in modules.values():
            module.head_gate = None
        model.train(was_training)
    if normalise:
        importance = {name: imp / imp.norm().clamp_min(1e-20) for name, imp in importance.items()}
    return importance


def prune_order(importance: dict[str, Tensor]) -> list[tuple[str, int]]:
    """Every (module, head) from least to most important, across the model (ties: module order)."""
    ranked = [(float(score), name, h) for name, scores in importance.items() for h, score in enumerate(scores)]
    return [(name, h) for _, name, h in sorted(ranked, key=lambda t: t[0])]


def heads_to_prune(importance: dict[str, Tensor], fraction: float) -> HeadSet:
    """The ``fraction`` of all heads with the lowest importance, never a layer's last head."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"the fraction of heads to prune must be in [0, 1) (got {fraction})")
    total = sum(len(s) for s in importance.values())
    target = round(fraction * total)
    chosen: HeadSet = {}
    for name, head in prune_order(importance):
        if sum(len(v) for v in chosen.values()) >= target:
            break
        if len(chosen.get(name, [])) + 1 < len(importance[name]):
            chosen.setdefault(name, []).append(head)
    return {name: sorted(heads) for name, heads in chosen.items()}


def mask_heads(model: nn.Module, heads: HeadSet) -> None:
    """Gate these heads to zero (and every other head to one); an empty set removes the gates."""
    for name, module in attention_modules(model).items():
        if heads.get(name):
            gate = torch.ones(module.n_heads)
            gate[heads[name]] = 0.0
            module.head_gate = gate
        else:
            module.head_gate = None
