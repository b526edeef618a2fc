"""attnlab/torch_private.py: the one module that names private PyTorch APIs. Pinned to the PyTorch
versions its names were checked on; each name resolves and does what attnlab relies on; and no
other module of the package names a private torch attribute."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from attnlab import torch_private
from attnlab.torch_private import (
    TESTED,
    is_strided_shard,
    per_channel_quantized,
    skips_on_device,
    step_unless,
    strided_shard,
    without_duck_sizing,
)

PACKAGE = Path(torch_private.__file__).parent
# private names of torch objects that attnlab reaches as attributes, strings or overrides
PRIVATE_NAMES = {
    "found_inf",
    "_step_supports_amp_scaling",
    "_partition_linear_fn",
    "_StridedShard",
    "_make_per_channel_quantized_tensor",
}


def test_torch_is_a_tested_version():
    """An upgrade fails here first: check each private name below on the new version, then add it."""
    assert ".".join(torch.__version__.split(".")[:2]) in TESTED, (
        f"torch {torch.__version__} is not among the versions attnlab/torch_private.py was checked on ({TESTED})"
    )


def test_every_private_name_resolves():
    import torch._inductor.config as inductor
    import torch.fx.experimental._config as fx_config
    from torch._dynamo.utils import counters
    from torch.distributed.tensor.parallel import ColwiseParallel
    from torch.distributed.tensor.placement_types import _StridedShard

    assert callable(torch._make_per_channel_quantized_tensor)
    assert callable(ColwiseParallel._partition_linear_fn)
    assert isinstance(_StridedShard(0, split_factor=3), _StridedShard)
    assert isinstance(fx_config.use_duck_shape, bool) and hasattr(inductor, "triton")
    assert isinstance(counters["inductor"], dict)


@pytest.mark.parametrize("skip, moves", [(True, False), (False, True)])
def test_a_fused_adam_skips_its_step_where_told_on_the_device(skip, moves):
    weight = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adam([weight], lr=0.1, fused=True)
    weight.grad = torch.full((3,), 0.5)
    assert skips_on_device(optimizer)
    step_unless(optimizer, torch.tensor(skip))
    assert torch.equal(weight.detach(), torch.ones(3)) is not moves
    if moves:  # Adam's first step moves each weight by lr against its gradient's sign
        torch.testing.assert_close(weight.detach(), torch.full((3,), 0.9))


def test_an_unfused_optimizer_does_not_skip_on_the_device():
    assert not skips_on_device(torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1))


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")  # deprecated: decode/weights.py says why
def test_per_channel_quantized_is_value_times_its_rows_scale():
    values = torch.tensor([[1, -2], [3, 127]], dtype=torch.int8)
    scales = torch.tensor([0.5, 0.25], dtype=torch.float64)
    q = per_channel_quantized(values, scales)
    assert torch.equal(q.int_repr(), values)
    torch.testing.assert_close(q.dequantize(), torch.tensor([[0.5, -1.0], [0.75, 31.75]]))


def test_a_strided_shard_is_known_as_one():
    from torch.distributed.tensor import Shard

    assert is_strided_shard(strided_shard(0, 3)) and not is_strided_shard(Shard(0)) and not is_strided_shard(None)


def test_without_duck_sizing_sets_the_tracers_switch_and_restores_it():
    import torch.fx.experimental._config as fx_config

    before = fx_config.use_duck_shape
    with without_duck_sizing():
        assert fx_config.use_duck_shape is False
    assert fx_config.use_duck_shape == before


def private_uses(source: str) -> list[str]:
    """Where ``source`` names a private torch attribute: an import of or from a private torch
    module or name, an attribute starting with '_' of a name bound to torch, or one of
    PRIVATE_NAMES as an attribute, a string, a name or a definition."""
    tree = ast.parse(source)
    torch_names: set[str] = set()
    found: list[str] = []

    def private(part: str) -> bool:
        return part.startswith("_") and not part.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    torch_names.add((alias.asname or alias.name).split(".")[0])
                    if any(private(p) for p in alias.name.split(".")):
                        found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                torch_names.add(alias.asname or alias.name)
                if any(private(p) for p in (*node.module.split("."), alias.name)):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            root = node
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in torch_names and private(node.attr):
                found.append(f"line {node.lineno}: {root.id}...{node.attr}")
        name = (
            node.attr
            if isinstance(node, ast.Attribute)
            else node.id
            if isinstance(node, ast.Name)
            else node.value
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            else node.name
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            else None
        )
        if name in PRIVATE_NAMES:
            found.append(f"line {node.lineno}: {name}")
    return found


def test_no_other_module_names_a_private_torch_attribute():
    uses = {
        str(path.relative_to(PACKAGE.parent)): private_uses(path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "torch_private.py"
    }
    assert {path: found for path, found in uses.items() if found} == {}


def test_the_scan_finds_each_kind_of_private_use():
    source = "\n".join(
        [
            "import torch",
            "import torch._inductor.config as inductor",
            "from torch.fx.experimental import _config",
            "from torch.distributed.tensor.placement_types import _StridedShard",
            "import torch.nn.functional as F",
            "x = torch._make_per_channel_quantized_tensor",
            "y = F._canonical_mask",
            "opt.found_inf = 1",
            "getattr(opt, '_step_supports_amp_scaling', False)",
            "z = torch.__version__",
            "w = other._private",
        ]
    )
    assert [use.split(":")[0] for use in private_uses(source)] == [
        "line 2",
        "line 3",
        "line 4",
        "line 6",
        "line 6",
        "line 7",
        "line 8",
        "line 9",
    ]
