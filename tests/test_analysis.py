"""Looking inside: capture equals the model's own Q and K and changes nothing; entropy, distance
and importance against hand computations; pruning by masking equals pruning by removal; the
budget's FLOPs against the formulas; the figures' colour bars, titles and numbers; inspect and prune
from the command line, with prune's and decoding's progress on stderr."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from matplotlib.colors import to_rgb
from PIL import Image

from attnlab.analysis.budget import budget_report
from attnlab.analysis.capture import attention_of, capture_attention
from attnlab.analysis.heads import (
    head_entropy,
    head_importance,
    heads_to_prune,
    mask_heads,
    mean_distance,
)
from attnlab.analysis.plots import (
    alignment_figure,
    alignment_plot,
    attention_figure,
    attention_heatmaps,
    entropy_figure,
    entropy_plot,
    positional_plots,
)
from attnlab.analysis.result_plots import pruning_plot
from attnlab.cli import main
from attnlab.data.tokenizers import BOS
from attnlab.decode import translate as translate_module
from attnlab.decode.search import greedy
from attnlab.nn.attention import CrossAttention, attention_modules, remove_heads
from attnlab.nn.masks import causal_mask
from attnlab.runs.config import RunConfig
from attnlab.train.run import train_run
from attnlab.train.step import layer_grad_norms

from helpers import random_ids, run_cli, sized, tiny_model


def encoder_decoder(**overrides):
    model = tiny_model(arch="encoder_decoder", **overrides)
    src = random_ids(2, 9)
    src[1, 6:] = 0  # padding
    return model, src, random_ids(2, 7, generator_seed=1)


def test_capture_equals_softmax_of_the_models_own_q_and_k():
    model, src, tgt = encoder_decoder(positions=dict(scheme="rotary"))
    inputs = {}
    for name, module in attention_modules(model).items():
        module.register_forward_pre_hook(lambda m, a, kw, name=name: inputs.setdefault(name, (a, kw)), with_kwargs=True)
    records = attention_of(model, src, tgt)
    H, Dh = 4, 4
    for name in ("encoder.layers.0.self_attn", "decoder.layers.1.self_attn", "decoder.layers.0.cross_attn"):
        module, (args, _) = attention_modules(model)[name], inputs[name]
        x = args[0]
        if isinstance(module, CrossAttention):
            q = module.q_proj(x).view(2, -1, H, Dh).transpose(1, 2)
            k = module.kv_proj(args[1]).view(2, -1, 2, H, Dh)[:, :, 0].transpose(1, 2)  # the memory
            allowed = (src != 0)[:, None, None, :]
        else:
            q, k, _ = module.qkv_proj(x).view(2, -1, 3, H, Dh).permute(2, 0, 3, 1, 4)
            pos = torch.arange(x.shape[1])
            q, k = module.positional.rotate(q, pos), module.positional.rotate(k, pos)
            allowed = (src != 0)[:, None, None, :] if name.startswith("encoder") else causal_mask(pos, pos)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(Dh)).masked_fill(~allowed, float("-inf"))
        torch.testing.assert_close(records[name].probs, scores.softmax(-1), atol=1e-6, rtol=0)
    assert set(records) == set(attention_modules(model))  # 2 encoder self, 2 decoder self, 2 cross


def test_capture_changes_no_number_and_cleans_up():
    model, src, tgt = encoder_decoder(attention_backend="math")
    plain = model(src, tgt)
    with capture_attention(model) as captured:
        assert torch.equal(model(src, tgt), plain)  # bit for bit
    assert len(captured.records) == 6
    model, src, tgt = encoder_decoder()  # auto: sdpa, and math while the weights are captured
    plain = model(src, tgt)
    with capture_attention(model) as captured:
        torch.testing.assert_close(model(src, tgt), plain, atol=1e-5, rtol=0)
    assert len(captured.records) == 6 and all(m.backend.name == "auto" for m in attention_modules(model).values())
    model, src, tgt = encoder_decoder(attention_backend="sdpa")  # switched to math inside, and back
    plain = model(src, tgt)
    with capture_attention(model) as captured:
        captured_out = model(src, tgt)
        assert all(type(m.backend).__name__ == "WeightsRecorder" for m in attention_modules(model).values())
    torch.testing.assert_close(captured_out, plain, atol=1e-5, rtol=0)
    assert all(m.backend.name == "sdpa" and not m._forward_hooks for m in attention_modules(model).values())
    assert torch.equal(model(src, tgt), plain)
    with pytest.raises(
        ValueError, match=r"'local' does not form .* an exact backend \('math', 'sdpa', 'auto', 'chunked'\)"
    ):
        with capture_attention(tiny_model(attention_backend="local", backends={"pattern": {"window": 2}})):
            pass


def test_capture_during_greedy_decoding_equals_the_teacher_forced_pass_over_its_output():
    model, src, _ = encoder_decoder()
    src = src[:1]
    with capture_attention(model) as captured:
        out = greedy(model, src, max_len=6, min_len=6)[0]
    steps = [r for r in captured.records if r.module == "decoder.layers.1.cross_attn"]
    assert len(steps) == 6 and all(s.probs.shape == (1, 4, 1, 9) for s in steps)
    forced = attention_of(model, src, torch.tensor([[BOS] + out[:5]]))["decoder.layers.1.cross_attn"].probs
    torch.testing.assert_close(torch.cat([s.probs for s in steps], dim=2), forced, atol=1e-5, rtol=0)
    self_steps = [r.probs for r in captured.records if r.module == "decoder.layers.0.self_attn"]
    forced_self = attention_of(model, src, torch.tensor([[BOS] + out[:5]]))["decoder.layers.0.self_attn"].probs
    for t, step in enumerate(self_steps):  # step t sees keys 0..t: row t of the causal matrix
        torch.testing.assert_close(step[0, :, 0], forced_self[0, :, t, : t + 1], atol=1e-5, rtol=0)


def test_capture_of_a_recurrent_models_alignment():
    model = tiny_model(arch="rnn", n_layers=1, rnn_attention="luong", score="general")
    src, tgt = random_ids(2, 8), random_ids(2, 5, generator_seed=1)
    src[0, 5:] = 0
    records = attention_of(model, src, tgt)
    (record,) = records.values()
    assert (record.stack, record.layer, record.kind) == ("decoder", 0, "cross")
    assert record.probs.shape == (2, 1, 5, 8)
    torch.testing.assert_close(record.probs[:, 0], model.decoder.last_attention)
    torch.testing.assert_close(record.probs.sum(-1), torch.ones(2, 1, 5))
    assert torch.equal(record.probs[0, :, :, 5:], torch.zeros(1, 5, 3))


def test_entropy_and_distance_by_hand():
    uniform = torch.full((1, 1, 2, 4), 0.25)
    one_hot = torch.tensor([[[[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]]])
    probs = torch.cat([uniform, one_hot], dim=1)  # (B=1, H=2, Tq=2, Tk=4)
    torch.testing.assert_close(head_entropy(probs), torch.tensor([math.log(4), 0.0]))
    # head 1: query 0 looks at key 1 (distance 1), query 1 at key 3 (distance 2): mean 1.5
    # head 0: query 0: (0+1+2+3)/4 = 1.5, query 1: (1+0+1+2)/4 = 1.0: mean 1.25
    torch.testing.assert_close(mean_distance(probs, torch.arange(2), torch.arange(4)), torch.tensor([1.25, 1.5]))
    valid = torch.tensor([[True, False]])  # only query 0 counts
    torch.testing.assert_close(mean_distance(probs, torch.arange(2), torch.arange(4), valid), torch.tensor([1.5, 1.0]))


def nll(model, batch):
    src, tgt_in, tgt_out = batch
    logits = model(src, tgt_in)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten())


def test_head_importance_is_the_gate_gradient():
    """|dL/d xi_h| against a central finite difference in the gate of one head."""
    model, src, tgt = encoder_decoder()
    batch = (src, tgt, random_ids(2, 7, generator_seed=2))
    model.train()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    raw = head_importance(model, [batch], nll, normalise=False)
    # untouched: the weights, the mode, and no gate left behind
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items()) and model.training
    assert all(m.head_gate is None for m in attention_modules(model).values())
    name, h = "decoder.layers.0.cross_attn", 2
    module = attention_modules(model)[name]
    losses = []
    for delta in (1e-3, -1e-3):
        gate = torch.ones(4, dtype=torch.float64)
        gate[h] += delta
        module.head_gate = gate
        with torch.no_grad():
            losses.append(nll(model.double(), tuple(batch)).item())
        model.float()
    module.head_gate = None
    torch.testing.assert_close(raw[name][h].item(), abs(losses[0] - losses[1]) / 2e-3, rtol=1e-3, atol=1e-6)
    assert all(p.requires_grad for p in model.parameters())
    normalised = head_importance(model, [batch], nll)
    torch.testing.assert_close(normalised[name].norm(), torch.tensor(1.0))


@pytest.mark.parametrize("positional", ["rotary", "alibi", "relative_bias"])
def test_pruning_by_masking_equals_removing_the_weights(positional):
    model, src, tgt = encoder_decoder(positions=dict(scheme=positional))
    heads = {
        "encoder.layers.0.self_attn": [1, 3],
        "decoder.layers.1.self_attn": [0],
        "decoder.layers.0.cross_attn": [0, 1, 2],
    }
    mask_heads(model, heads)
    masked = model(src, tgt)
    mask_heads(model, {})
    assert not torch.allclose(model(src, tgt), masked)
    remove_heads(model, heads)
    torch.testing.assert_close(model(src, tgt), masked, atol=1e-5, rtol=0)  # to rounding: smaller matrices
    cross = attention_modules(model)["decoder.layers.0.cross_attn"]
    assert cross.n_heads == 1 and cross.kv_proj.out_features == 8 and cross.out_proj.in_features == 4
    with pytest.raises(ValueError, match="every head"):
        cross.prune_heads([0])


def test_heads_to_prune_takes_the_least_important_and_keeps_a_head_per_layer():
    importance = {"a": torch.tensor([0.1, 0.9]), "b": torch.tensor([0.05, 0.2, 0.3, 0.01])}
    assert heads_to_prune(importance, 0.0) == {}
    assert heads_to_prune(importance, 0.5) == {"a": [0], "b": [0, 3]}  # 3 of 6: 0.01, 0.05, 0.1
    assert heads_to_prune(importance, 0.67) == {"a": [0], "b": [0, 1, 3]}  # 4 of 6: then 0.2
    # 5 of 6 would take the last head of 'b' (0.3) or of 'a' (0.9): neither is taken
    assert heads_to_prune(importance, 0.84) == {"a": [0], "b": [0, 1, 3]}
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        heads_to_prune(importance, 1.0)


def test_layer_grad_norms_are_the_norms_of_each_layers_gradients():
    model, src, tgt = encoder_decoder()
    model(src, tgt).square().mean().backward()
    norms = layer_grad_norms(model)
    assert set(norms) == {"encoder.layers.0", "encoder.layers.1", "decoder.layers.0", "decoder.layers.1"}
    expected = torch.cat(
        [p.grad.flatten() for n, p in model.named_parameters() if n.startswith("decoder.layers.1.")]
    ).norm()
    assert norms["decoder.layers.1"] == pytest.approx(float(expected), rel=1e-6)


def png_labels(path):
    image = Image.open(path)
    return image.size, json.loads(image.text["Description"])


def test_figures_are_pngs_that_carry_their_labels(tmp_path):
    probs = torch.softmax(torch.randn(3, 4, 5), -1)
    size, labels = png_labels(attention_heatmaps(probs, list("abcd"), list("vwxyz"), "t", tmp_path / "h.png"))
    assert (
        size[0] >= 400 and labels["rows"] == list("abcd") and labels["cols"] == list("vwxyz") and labels["heads"] == 3
    )
    size, labels = png_labels(alignment_plot(probs[0], list("vwxyz"), list("abcd"), "a", tmp_path / "a.png"))
    assert labels == {"title": "a", "rows": list("abcd"), "cols": list("vwxyz")}
    _, labels = png_labels(
        entropy_plot({"m1": torch.tensor([1.0, 2.0]), "m2": torch.tensor([0.5])}, tmp_path / "e.png")
    )
    assert labels["rows"] == ["m1", "m2"] and labels["cols"] == ["head 0", "head 1"]
    _, labels = png_labels(pruning_plot([0, 0.5], [30.0, 29.0], "bleu", tmp_path / "p.png"))
    assert labels["values"] == [30.0, 29.0]
    table, curve = positional_plots(tmp_path, dim=8, positions=10, bases=(100.0, 10000.0), max_offset=10)
    assert png_labels(curve)[1]["bases"] == [100.0, 10000.0] and png_labels(table)[0][0] >= 400


def test_a_heatmap_of_many_positions_stays_readable(tmp_path):
    """A captioner's encoder self-attention over 64 patches, 4 heads: 6,192 x 1,528 px with 64
    overlapping labels per axis before (issue 64); panels at most 6 inches, every 2nd label."""
    patches = [f"p{i}" for i in range(64)]
    probs = torch.softmax(torch.randn(4, 64, 64, generator=torch.Generator().manual_seed(0)), -1)
    size, labels = png_labels(attention_heatmaps(probs, patches, patches, "encoder", tmp_path / "h.png"))
    assert size[0] <= 100 * (4 * 6.0 + 0.8) and size[1] <= 100 * 6.5 and labels["cols"] == patches  # dpi 100
    ax = attention_figure(probs, patches, patches, "encoder").axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == patches[::2] == [t.get_text() for t in ax.get_yticklabels()]
    few = attention_figure(probs[:, :5, :5], patches[:5], patches[:5], "t").axes[0]
    assert [t.get_text() for t in few.get_xticklabels()] == patches[:5]  # few positions: every label


def luma(colour) -> float:
    r, g, b = to_rgb(colour)
    return 0.299 * r + 0.587 * g + 0.114 * b


def test_heatmaps_have_a_colour_bar_on_the_scale_of_their_data():
    probs = torch.softmax(torch.randn(3, 4, 5), -1)
    fig = attention_figure(probs, list("abcd"), list("vwxyz"), "t")
    assert len(fig.axes) == 3 + 1  # a panel per head, and one colour bar for them all
    assert fig.axes[-1].get_ylim() == (0.0, 1.0)  # every head on the probabilities' scale
    assert all(ax.images[0].get_clim() == (0.0, 1.0) for ax in fig.axes[:3])
    fig = alignment_figure(probs[0], list("vwxyz"), list("abcd"), "a")
    assert len(fig.axes) == 2 and fig.axes[1].get_ylim() == (0.0, 1.0)
    entropy = {"m1": torch.tensor([1.0, 2.0]), "m2": torch.tensor([0.5])}  # m2 has no head 1: blank cell
    fig = entropy_figure(entropy)
    assert len(fig.axes) == 2 and fig.axes[1].get_ylim() == pytest.approx((0.5, 2.0))  # the data's min and max


def test_entropy_numbers_are_large_and_contrast_with_their_cell():
    values = {"m1": torch.tensor([0.1, 0.6, 1.1]), "m2": torch.tensor([1.6, 2.1, 2.6])}
    fig = entropy_figure(values)
    ax = fig.axes[0]
    image = ax.images[0]
    cells = {t.get_position(): t for t in ax.texts}
    assert len(cells) == 6  # one number per head, none for the blank
    for i, row in enumerate(values.values()):
        for h, value in enumerate(row.tolist()):
            text = cells[(h, i)]
            assert text.get_text() == f"{value:.2f}" and text.get_fontsize() >= 9
            assert abs(luma(text.get_color()) - luma(image.cmap(image.norm(value)))) >= 0.5
    assert {text.get_color() for text in ax.texts} == {"black", "white"}  # magma runs from dark to light


@pytest.mark.parametrize("source, target", [(3, 3), (9, 18), (1, 1)])
def test_alignment_title_lies_within_the_figure(source, target):
    title = "decoder.layers.1.cross_attn: alignment, heads averaged, a title longer than the figure is wide"
    fig = alignment_figure(
        torch.softmax(torch.randn(target, source), -1),
        [f"s{i}" for i in range(source)],
        [f"I_TURN_LEFT{i}" for i in range(target)],
        title,
    )
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    [drawn] = [t for t in fig.texts if t.get_text() == title]
    box, page = drawn.get_window_extent(renderer), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    assert box.height > 1.5 * drawn.get_fontsize() * fig.dpi / 72  # wrapped: more than one line of text
    for ax in fig.axes:  # nothing else is cut either: tick labels, axis labels, the colour bar's label
        extent = ax.get_tightbbox(renderer)
        assert page.x0 <= extent.x0 and extent.x1 <= page.x1 + 1 and page.y0 <= extent.y0 and extent.y1 <= page.y1 + 1


def test_budget_flops_match_the_formulas():
    """Per attention module 2 x 2 B Tq Tk d for Q K^T and the weighted sum; per FFN 2 x 2 B T d d_ff;
    the output layer 2 B T d V. Projections: 3 (self) or 1 + 2 (cross, over S) times 2 B T d^2, plus W^O."""
    cfg, shape = sized(
        vocab_size=50, stack=dict(d_model=16, n_heads=2, n_layers=2, d_ff=48, dropout=0.1, attention_backend="math")
    )  # the formulas of explicit scores
    B, T, S, d = 3, 10, 7, 16
    report = budget_report(cfg, shape, T, B, src_len=S)
    kinds = report["flops"]["forward_by_kind"]
    assert kinds["attention_scores"] == 4 * B * d * (2 * S * S + 2 * T * T + 2 * T * S)
    assert kinds["feed_forward"] == 4 * B * d * 48 * (2 * S + 2 * T)
    assert kinds["output"] == 2 * B * T * d * 50
    assert kinds["attention_projections"] == 2 * B * d * d * (2 * 4 * S + 2 * 4 * T + 2 * (2 * T + 2 * S))
    assert report["flops"]["forward_backward"] == 3 * report["flops"]["forward"]  # backward: 2 products per product
    memory = report["training_memory"]
    assert memory["weights"] == 4 * report["params"] and memory["adam_moments"] == 8 * report["params"]
    # saved attention matrices, float32, per head (2): the probabilities and their masked copy, for all
    # 6 modules (2 encoder S x S, 2 decoder T x T, 2 cross T x S)
    assert memory["of_which_attention_matrices"] == 4 * B * 2 * 2 * (2 * S * S + 2 * T * T + 2 * T * S)
    assert report["inference_memory"]["kv_cache"] == 2 * 2 * B * (T + S) * d * 4


@pytest.fixture(scope="module")
def demo_like_run(tmp_path_factory):
    """A tiny Transformer trained for a few seconds on the built-in reverse task."""
    out = tmp_path_factory.mktemp("runs") / "reverse"
    cfg = RunConfig.from_sections(
        {
            "model": {
                "stack": {"d_model": 32, "n_heads": 4, "n_layers": 1, "d_ff": 64, "dropout": 0.0, "norm": "pre"},
                "positions": {"scheme": "rotary"},
            },
            "data": {
                "format": "builtin",
                "generator": {"name": "reverse", "min_len": 3, "max_len": 6},
                "text": {"tokenizer": "word"},
                "n_train": 600,
                "n_valid": 40,
                "n_test": 40,
            },
            "train": {
                "max_steps": 120,
                "max_tokens": 600,
                "lr_schedule": "constant",
                "lr": 0.005,
                "warmup_steps": 10,
                "eval_every": 120,
                "eval_exact_match": 40,
                "progress": False,
                "early_stop_metric": "exact_match",
            },
        }
    )
    train_run(cfg, out, log=lambda s: None)
    return out


def test_inspect_writes_labelled_heatmaps_and_entropies(demo_like_run, tmp_path):
    figures = tmp_path / "figures"
    done = run_cli("inspect", str(demo_like_run), "--src", "3 1 4 1", "--out", str(figures))
    assert done.returncode == 0, done.stderr
    summary = json.loads((figures / "summary.json").read_text())
    assert summary["source_tokens"] == ["3", "1", "4", "1", "<eos>"]
    assert set(summary["modules"]) == {
        "encoder.layers.0.self_attn",
        "decoder.layers.0.self_attn",
        "decoder.layers.0.cross_attn",
    }
    for entry in summary["modules"].values():
        assert len(entry["entropy"]) == 4 and all(0 <= e <= entry["uniform_entropy"] + 1e-4 for e in entry["entropy"])
    size, labels = png_labels(figures / "decoder-0-cross.png")
    assert size[0] >= 400 and labels["cols"] == summary["source_tokens"]
    assert labels["rows"] == summary["target_tokens"] and labels["rows"][-1] == "<eos>"
    assert png_labels(figures / "decoder-0-cross-alignment.png")[1]["cols"] == summary["source_tokens"]
    assert (figures / "entropy.png").stat().st_size > 5000
    again = run_cli("inspect", str(demo_like_run), "--src", "3 1", "--out", str(figures))
    assert again.returncode == 2 and "--force" in again.stderr
    unknown = run_cli("inspect", str(demo_like_run), "--src", " ", "--out", str(figures))  # the input first
    assert (
        unknown.returncode == 2
        and unknown.stderr == "error: --src is empty after tokenisation; give at least one known token\n"
    )


def test_inspect_without_out_writes_a_new_folder_each_time_and_names_it(demo_like_run):
    made = []
    for text in ("3 1 4 1", "3 1 4 1", "5 9"):
        done = run_cli("inspect", str(demo_like_run), "--src", text)
        assert done.returncode == 0, done.stderr
        made.append(Path(done.stdout.splitlines()[-1].split(" in ", 1)[1]))
    assert [p.relative_to(demo_like_run / "inspect") for p in made] == [
        Path("1-3-1-4-1"),
        Path("2-3-1-4-1"),
        Path("3-5-9"),
    ]
    assert all(json.loads((p / "summary.json").read_text())["out"] == str(p) for p in made)
    assert json.loads((made[2] / "summary.json").read_text())["source"] == "5 9"
    refused = run_cli("inspect", str(demo_like_run), "--src", " ")
    assert refused.returncode == 2 and len(list((demo_like_run / "inspect").iterdir())) == 3  # no empty folder


def test_prune_reports_before_and_after_and_writes_a_loadable_smaller_run(demo_like_run, tmp_path):
    out = tmp_path / "pruned"
    done = run_cli("prune", str(demo_like_run), "--fraction", "0.5", "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.splitlines()[-2])
    before, after = summary["results"]
    assert before["heads_pruned"] == 0 and after["heads_pruned"] == 6 and after["heads_total"] == 12
    pruned = json.loads((out / "pruned_heads.json").read_text())
    assert sum(len(v) for v in pruned.values()) == 6 and all(len(v) < 4 for v in pruned.values())
    scored = run_cli("evaluate", str(out), "--split", "valid", "--beam", "1", "--json")
    assert scored.returncode == 0, scored.stderr
    result = json.loads(scored.stdout)
    assert result["exact_match"] == pytest.approx(after["exact_match"])  # removed == masked
    assert result["bleu"] == pytest.approx(after["bleu"])
    again = run_cli("prune", str(demo_like_run), "--fraction", "0.2", "--out", str(out))
    assert again.returncode == 2 and "already exists" in again.stderr


def test_prune_reports_each_measurement_on_stderr_and_where_the_plot_went(demo_like_run, tmp_path, capsys):
    plot = tmp_path / "figures" / "pruning.png"
    assert main(["prune", str(demo_like_run), "--fraction", "0.25", "0.5", "--limit", "10", "--plot", str(plot)]) == 0
    out, err = capsys.readouterr()
    lines = [line for line in re.split(r"[\r\n]", err) if line.strip()]  # a slow decoding's bar may be among them
    assert re.fullmatch(r"ranked 12 heads by importance on valid in \d+\.\d s", lines[0])
    measured = [
        m.groups()
        for m in map(
            re.compile(
                r"\[(\d)/3\] measured valid with (\d+)/12 heads pruned "
                r"\((\d+)%\) in \d+\.\d s"
            ).fullmatch,
            lines,
        )
        if m
    ]
    assert measured == [("1", "0", "0"), ("2", "3", "25"), ("3", "6", "50")]  # as each one ends, in order
    assert lines[-1] == f"plot: {plot}" and png_labels(plot)[1]["fractions"] == [0.0, 0.25, 0.5]
    assert len(out.splitlines()) == 3 and "plot" not in out  # stdout: the results alone
    assert main(["prune", str(demo_like_run), "--fraction", "0.5", "--plot", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_evaluate_and_translate_show_a_progress_bar_once_decoding_takes_a_while(
    demo_like_run, tmp_path, capsys, monkeypatch
):
    args = ["evaluate", str(demo_like_run), "--split", "valid", "--beam", "1", "--json"]
    monkeypatch.setattr(translate_module, "PROGRESS_DELAY", 600.0)
    assert main(args) == 0  # done before the bar's delay: no bar
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)["sentences"] == 40
    monkeypatch.setattr(translate_module, "PROGRESS_DELAY", 0.0)
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "0/40" in err and "sentence/s" in err  # the bar, on stderr
    assert json.loads(out)["sentences"] == 40  # stdout unchanged
    (tmp_path / "in.txt").write_text("3 1 4\n1 5\n9 2 6\n")
    assert main(["translate", str(demo_like_run), "--input", str(tmp_path / "in.txt"), "--beam", "1"]) == 0
    out, err = capsys.readouterr()
    assert "0/3" in err and "sentence/s" in err and len(out.splitlines()) == 3


def test_inspect_split_gives_mean_entropies_of_every_head(demo_like_run):
    from attnlab.analysis.inspect import entropy_over_split

    entropies = entropy_over_split(demo_like_run, "valid")
    assert set(entropies) == {"encoder.layers.0.self_attn", "decoder.layers.0.self_attn", "decoder.layers.0.cross_attn"}
    longest = math.log(8)  # reverse task: at most 6 symbols + EOS / BOS
    assert all(len(v) == 4 and all(0.0 <= e <= longest for e in v) for v in entropies.values())
    done = run_cli("inspect", str(demo_like_run), "--split", "valid")
    assert done.returncode == 0 and done.stdout.count("per head") == 3
