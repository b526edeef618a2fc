"""The tensor-parallel plan a model declares (nn/tensor_plan.py): Megatron's split of every layer
of its attention stacks, by the components' own structure, and the plan's union and regions."""

from __future__ import annotations

from attnlab.models import FAMILIES, build_model
from attnlab.nn.interfaces import TensorParallelModel
from attnlab.nn.tensor_plan import COLUMNS, ROWS, LinearSplit, Split, TensorPlan

from helpers import sized


def test_an_encoder_decoders_plan_splits_each_layers_projections_and_divides_its_attention_heads():
    plan = build_model(*sized(vocab_size=30, stack={"n_layers": 1})).tensor_plan()
    encoder, decoder = "encoder.layers.0", "decoder.layers.0"
    assert plan.linears == {
        f"{encoder}.self_attn.qkv_proj": LinearSplit(Split.COLUMNS, blocks=3),
        f"{encoder}.self_attn.out_proj": ROWS,
        f"{encoder}.feed_forward.w_1": COLUMNS,
        f"{encoder}.feed_forward.w_2": ROWS,
        f"{decoder}.self_attn.qkv_proj": LinearSplit(Split.COLUMNS, blocks=3),
        f"{decoder}.self_attn.out_proj": ROWS,
        f"{decoder}.cross_attn.q_proj": COLUMNS,
        f"{decoder}.cross_attn.kv_proj": LinearSplit(Split.COLUMNS, blocks=2),
        f"{decoder}.cross_attn.out_proj": ROWS,
        f"{decoder}.feed_forward.w_1": COLUMNS,
        f"{decoder}.feed_forward.w_2": ROWS,
    }
    assert sorted(plan.heads) == [f"{decoder}.cross_attn", f"{decoder}.self_attn", f"{encoder}.self_attn"]
    assert sorted(plan.regions) == sorted([*plan.heads, f"{encoder}.feed_forward", f"{decoder}.feed_forward"])


def test_a_plan_covers_every_layer_of_each_stack_it_names():
    model = build_model(*sized(arch="decoder_lm", vocab_size=30, stack={"n_layers": 3}))
    plan = model.tensor_plan()
    assert len(plan.linears) == 3 * 4 and len(plan.heads) == 3
    assert {path.split(".")[2] for path in plan.linears} == {"0", "1", "2"}
    assert not any(path.startswith(("embed", "generator")) for path in plan.linears)  # replicated


def test_plans_join_and_a_model_adds_its_own_linears():
    a = TensorPlan({"x.w_1": COLUMNS}, ("x",))
    b = TensorPlan({"head.w_in": COLUMNS, "head.w_out": ROWS})
    assert (a | b) == TensorPlan({"x.w_1": COLUMNS, "head.w_in": COLUMNS, "head.w_out": ROWS}, ("x",))
    assert (a | b).regions == ("x", "head")


def test_every_built_in_family_with_an_attention_stack_declares_a_plan():
    with_plan = sorted(n for n, f in FAMILIES.items() if issubclass(f.model, TensorParallelModel))
    with_stack = sorted(n for n, f in FAMILIES.items() if "stack" in f.config.field_names())
    assert with_plan == with_stack and len(with_plan) == 16
