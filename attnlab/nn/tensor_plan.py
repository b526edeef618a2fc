"""How tensor parallelism (Megatron-LM, Shoeybi et al. 2019) divides a model across N ranks, as
plain data that a model declares (its ``tensor_plan()``, nn/interfaces.py) and train.strategy tp
applies (parallel/tensor_parallel.py).

A linear map y = x W^T + b is divided either by its output features, **columns** (rank r holds
W's rows of its share of y: y_r = x W_r^T + b_r, no communication), or by its input features,
**rows** (rank r holds W's columns of its share of x: y = sum over ranks of x_r W_r^T, one
all-reduce, b added once). Megatron's transformer layer pairs them so that only the second of each
pair communicates:

    attention     [W^Q; W^K; W^V] by columns, block by block (rank r: its heads' Q_r, K_r, V_r),
                  W^O by rows; the attention module keeps n_heads / N heads
    feed-forward  W_1 by columns, W_2 by rows

Everything a plan does not name (embeddings, norms, the output projection) is replicated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from torch import nn

from attnlab.nn.attention import CrossAttention, MultiHeadAttention, SelfAttention
from attnlab.nn.feedforward import PositionWiseFeedForward


class Split(StrEnum):
    COLUMNS = "columns"  # output features divided: each rank computes its share of y
    ROWS = "rows"  # input features divided: each rank a partial sum of y, added by one all-reduce


@dataclass(frozen=True)
class LinearSplit:
    """How one nn.Linear is divided; ``blocks``: the matrices stacked by output rows in a fused
    projection ([W^Q; W^K; W^V]: 3), each divided on its own, so that a rank holds block r of each."""

    split: Split
    blocks: int = 1


COLUMNS = LinearSplit(Split.COLUMNS)
ROWS = LinearSplit(Split.ROWS)


@dataclass(frozen=True)
class TensorPlan:
    """``linears``: module path -> how that nn.Linear is divided; ``heads``: the paths of the
    attention modules whose heads the ranks divide (each keeps n_heads / N)."""

    linears: dict[str, LinearSplit] = field(default_factory=dict)
    heads: tuple[str, ...] = ()

    def __or__(self, other: TensorPlan) -> TensorPlan:
        return TensorPlan(self.linears | other.linears, self.heads + other.heads)

    @property
    def regions(self) -> tuple[str, ...]:
        """The modules whose inner values are split: the owners of the divided linears (an attention
        module, a feed-forward block)."""
        return tuple(dict.fromkeys(path.rpartition(".")[0] for path in self.linears))


# each component's own linears, by attribute
COMPONENT_SPLITS: dict[type[nn.Module], dict[str, LinearSplit]] = {
    SelfAttention: {"qkv_proj": LinearSplit(Split.COLUMNS, blocks=3), "out_proj": ROWS},
    CrossAttention: {"q_proj": COLUMNS, "kv_proj": LinearSplit(Split.COLUMNS, blocks=2), "out_proj": ROWS},
    PositionWiseFeedForward: {"w_1": COLUMNS, "w_2": ROWS},
}


def component_plan(module: nn.Module, path: str) -> TensorPlan:
    """Megatron's plan of the attention module or feed-forward block at ``path`` (empty for anything else)."""
    splits = next((s for cls, s in COMPONENT_SPLITS.items() if isinstance(module, cls)), {})
    heads = (path,) if splits and isinstance(module, MultiHeadAttention) else ()
    return TensorPlan({f"{path}.{name}": how for name, how in splits.items()}, heads)


def megatron(model: nn.Module, *stacks: str) -> TensorPlan:
    """Megatron's plan for every layer of ``model``'s attention stacks at the paths ``stacks``
    (a LayerStack each, e.g. ``"encoder"``, ``"decoder"``): each layer's attention modules and
    feed-forward blocks split as the module's docstring says."""
    plan = TensorPlan()
    for stack in stacks:
        for path, module in model.get_submodule(f"{stack}.layers").named_modules(prefix=f"{stack}.layers"):
            plan |= component_plan(module, path)
    return plan
