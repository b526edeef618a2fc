"""The cheap-mask dropout against F.dropout: the same rate and scaling, a backward through the
same mask, reproducible from the seed, identity in eval mode."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn.dropout import Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_rate_and_scale_match_f_dropout(p):
    ones = torch.ones(2_000_000)
    ours, theirs = dropout(ones, p), F.dropout(ones, p)
    assert abs((ours == 0).float().mean().item() - p) < 1.5e-3  # 4 standard errors at 2M draws
    kept = ours[ours != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1 / (1 - p)), rtol=1e-4)  # p to 1/65536
    assert abs(ours.mean().item() - theirs.mean().item()) < 3e-3  # both unbiased


def test_backward_goes_through_the_same_mask():
    x = torch.randn(1000, 64, requires_grad=True)
    torch.manual_seed(5)
    y = dropout(x, 0.2)
    (g,) = torch.autograd.grad((y * 3.0).sum(), x)
    scale = (y[y != 0] / x[y != 0]).mean()
    assert scale.item() == pytest.approx(1 / 0.8, rel=1e-4)  # 65536 / (65536 - round(0.2 * 65536))
    torch.testing.assert_close(g, (y != 0).float() * 3.0 * scale)


def test_seeded_and_off_in_eval():
    x = torch.randn(500)
    torch.manual_seed(1)
    a = dropout(x, 0.5)
    torch.manual_seed(1)
    assert torch.equal(a, dropout(x, 0.5))
    module = Dropout(0.5).eval()
    assert torch.equal(module(x), x) and torch.equal(dropout(x, 0.0), x)
    with pytest.raises(ValueError):
        dropout(x, 1.0)


def test_bf16_keeps_its_dtype_and_its_numbers():
    from attnlab.nn.dropout import drop_mask

    x = torch.randn(1000, dtype=torch.bfloat16, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.1)
    y.sum().backward()
    assert y.dtype == x.grad.dtype == torch.bfloat16
    torch.manual_seed(3)
    drop, scale = drop_mask(x.shape, 0.1, x.device)
    keep = (~drop).float()
    assert torch.equal(y, (x.detach().float() * keep * scale).bfloat16())  # one rounding, as the fast path
    assert torch.equal(x.grad, (keep * scale).bfloat16())


def test_equals_the_product_with_the_textbook_mask():
    """The fast form (masked_fill) gives bit for bit x * keep * scale from the same random draws."""
    from attnlab.nn.dropout import LEVELS, drop_mask

    x = torch.randn(3, 7, 11, requires_grad=True)
    torch.manual_seed(2)
    y = dropout(x, 0.25)
    torch.manual_seed(2)
    drop, scale = drop_mask(x.shape, 0.25, x.device)
    assert scale == LEVELS / (LEVELS - round(0.25 * LEVELS))
    keep = (~drop).to(x.dtype)
    assert torch.equal(y, x * keep * scale)
    (g,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(g, keep * scale)


def test_a_cuda_tensor_goes_through_torchs_fused_dropout(monkeypatch):
    """The cheap masks are the CPU's remedy; a CUDA tensor gets F.dropout with the same p (here a CPU
    tensor that says it is on CUDA: there is no GPU), any other tensor never does."""
    calls = []
    real = F.dropout
    monkeypatch.setattr(F, "dropout", lambda x, p, training: calls.append((p, training)) or real(x, p, training))
    dropout(torch.ones(4, 8), 0.25)
    dropout(torch.empty(4, 8, device="meta"), 0.25)  # the memory budget's device counts the CPU's masks
    assert calls == []
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    out = dropout(torch.ones(4, 8), 0.25)
    assert calls == [(0.25, True)] and set(out.unique().tolist()) <= {0.0, torch.tensor(1 / 0.75).item()}


@pytest.mark.parametrize("varied_shapes", [False, True])
@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_lm", "encoder_only"])
def test_a_training_step_with_dropout_compiles_whole_and_at_most_twice(arch, varied_shapes, monkeypatch):
    """What `attnlab train` compiles (train/step.py's ``compiled``: the task's loss with the model's
    forward inside, under bf16 autocast) is one graph for each family with dropout on, no break
    (``random_`` broke it at every dropout site: 38 breaks in this encoder-decoder), and is traced at
    most twice over 30 batches of 2 or 3 rows of lengths 3 to 32: static, then once with dynamic
    shapes; once, where the data says its batches vary (``varied_shapes``: sizes dynamic from the
    first batch, whose 3 rows of 3 tokens would otherwise become one size)."""
    import torch._dynamo as dynamo

    from attnlab.data.batching import Batch
    from attnlab.eval.likelihood import teacher_forced_loss
    from attnlab.precision import autocast
    from attnlab.tasks.masked_lm import MaskedLMConfig, MLMBatch
    from attnlab.train.step import compiled

    from helpers import random_ids, tiny_model

    model = tiny_model(arch=arch, dropout=0.1).train()
    src, tgt = random_ids(3, 41, generator_seed=1), random_ids(3, 41, generator_seed=2)
    src[1, 20:] = 0
    own = lambda ids: ids.clone()  # a collated batch's tensors are its own, not views of a larger one
    if arch == "encoder_only":
        objective = MaskedLMConfig().task.loss
        batch = lambda B, T: MLMBatch(inputs=own(tgt[:B, :T]), targets=own(tgt[:B, 1 : T + 1]))
    else:
        objective = teacher_forced_loss
        batch = lambda B, T: Batch(
            src=own(src[:B, : T + 2]) if arch == "encoder_decoder" else None,
            tgt_in=own(tgt[:B, :T]),
            tgt_out=own(tgt[:B, 1 : T + 1]),
        )
    amp = autocast("bf16", torch.device("cpu"))
    step = lambda fn, B, T: fn(model, batch(B, T), 0.1, amp)[0].backward()
    dynamo.reset()
    explained = dynamo.explain(objective)(model, batch(3, 6), 0.1, amp)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    graphs = []

    def counting_backend(graph, example_inputs, **inductor_options):
        graphs.append(graph)
        return graph.forward

    dynamo.reset()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=counting_backend))
    compiled_objective = compiled(objective, varied_shapes=varied_shapes)
    for T in range(3, 33):
        step(compiled_objective, 2 + T % 2, T)
    assert len(graphs) == 1 if varied_shapes else 1 <= len(graphs) <= 2


def test_varied_shapes_compile_without_size_guards_where_inductor_has_the_switch(monkeypatch):
    """Dynamic sizes go to torch.compile with Inductor's non-strict mixed-order reduction, which
    adds no guard on them (PyTorch 2.11's ``512*B*T < 5242880`` cost the Multi30k recipe a third
    graph); a PyTorch without the switch gets no option it would refuse."""
    import torch._inductor.config as inductor

    from attnlab.train.step import compiled

    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: calls.append(kwargs) or fn)
    compiled(print, varied_shapes=True)
    compiled(print)
    assert calls == [{"dynamic": True, "options": {"triton.mix_order_reduction_non_strict_mode": True}}, {}]
    assert inductor.triton.mix_order_reduction_non_strict_mode is False  # set for that compile alone
    monkeypatch.delattr(inductor.triton, "mix_order_reduction_non_strict_mode")
    compiled(print, varied_shapes=True)
    assert calls[-1] == {"dynamic": True, "options": {}}
