"""`attnlab info --parallel N`: per-rank training memory of each strategy, counted by hand for a tiny
decoder-only model (fsdp+tp too), and its activations those of analysis/budget.py."""

from __future__ import annotations

import json

import pytest

from attnlab.analysis.budget import budget_report
from attnlab.analysis.parallel_budget import NUMBERS, parallel_memory
from attnlab.models import build_model

from helpers import run_cli, sized

D, H, FF, L, V, T, B = 16, 4, 32, 4, 30, 8, 4


def tiny():
    return sized(
        arch="decoder_lm",
        vocab_size=V,
        stack=dict(d_model=D, n_heads=H, n_layers=L, d_ff=FF, dropout=0.0, norm="pre"),
        embeddings=dict(tie="none"),
        positions=dict(scheme="sinusoidal"),
    )


def test_per_rank_weights_are_counted_by_hand_and_activations_are_the_budgets():
    n = 2
    report = parallel_memory(*tiny(), T, B, ranks=n, micro_batches=4)
    budget = budget_report(*tiny(), T, B)["training_memory"]
    W = budget["weights"] // 4  # values
    assert report["one process"]["weights"] == budget["weights"]
    assert report["one process"]["activations"] == budget["activations"]
    assert report["ddp"]["activations"] == budget["activations"] // n
    # Megatron's plan splits per layer: W_qkv (3d x d) + its bias 3d, W_O (d x d), W_1 (ff x d) + b_1, W_2 (d x ff);
    # b_O, b_2 and the norms stay whole
    split = L * (3 * D * D + 3 * D + D * D + FF * D + FF + D * FF)
    assert report["tp"]["weights"] == 4 * (W - split + split // n)
    # pp: 4 layers on 2 stages; the first also holds the embedding V x d, the last the final norm 2d (pre-norm) and
    # the output projection V x d (no bias): the heavier stage's gradients
    layer = 3 * D * D + 3 * D + D * D + D + FF * D + FF + D * FF + D + 2 * 2 * D  # two norms of 2d
    assert report["pp gpipe"]["gradients"] == 4 * max(V * D + 2 * layer, 2 * layer + 2 * D + V * D)
    # 1F1B keeps min(N, m) = 2 of m = 4 micro-batches' activations, GPipe all 4
    assert report["pp 1f1b"]["activations"] * 2 == report["pp gpipe"]["activations"]


def test_pp_does_not_apply_to_fewer_layers_than_ranks_and_the_cli_prints_the_table(tmp_path):
    cfg, shape = sized(vocab_size=V, stack=dict(d_model=D, n_heads=H, n_layers=1, d_ff=FF))  # 1 + 1 layers on 4 ranks
    assert parallel_memory(cfg, shape, T, B, 4, 4)["pp gpipe"]["total"] is None
    config = tmp_path / "m.yaml"
    config.write_text(
        json.dumps(
            {
                "model": {
                    "arch": "decoder_lm",
                    "stack": {"d_model": D, "n_heads": H, "n_layers": L, "d_ff": FF},
                    "embeddings": {"tie": "none"},
                },
                "shape": {"vocab_size": V},
            }
        )
    )
    done = run_cli("info", str(config), "--parallel", "2", "--seq-len", str(T), "--batch", str(B), "--json")
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)["parallel_memory"]) == {
        "one process",
        "ddp",
        "fsdp",
        "tp",
        "pp gpipe",
        "pp 1f1b",
        "fsdp+tp",
    }
    refused = run_cli("info", str(config), "--parallel", "1")
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1
    assert "--parallel needs at least 2" in refused.stderr


@pytest.mark.parametrize("ranks", [2, 4])
def test_fsdp_holds_a_share_of_everything_and_one_unit_whole(ranks):
    r = parallel_memory(*tiny(), T, B, ranks, 4)
    W = r["one process"]["weights"]
    assert r["fsdp"]["gradients"] == W // ranks and r["fsdp"]["adam_moments"] == 2 * (W // ranks)
    assert r["fsdp"]["weights"] > W // ranks


def test_fsdp_tp_holds_its_tp_share_sharded_over_dp_counted_by_hand():
    """4 ranks, tp 2 x dp 2. A layer's tp share (parallel/tensor_parallel.py's plan, as the tp test above
    counts it) is half its split parameters and all the rest; FSDP then shards it over dp 2, except
    the fused W_qkv bias's share, 3d / 2, which every rank of a dp group holds whole
    (parallel/fsdp_tp.py); the weights add the largest unit gathered (a layer's share less that bias,
    or the embeddings, final norm and output projection); activations are tp's on 2 ranks for half
    the batch."""
    r = parallel_memory(*tiny(), T, B, ranks=4, micro_batches=4, tensor_parallel=2)["fsdp+tp"]
    split = 3 * D * D + 3 * D + D * D + FF * D + FF + D * FF
    share = split // 2 + D + D + 2 * 2 * D  # b_O, b_2 and two norms of 2d whole
    bias = 3 * D // 2
    rest = V * D + 2 * D + V * D  # embedding, final norm, output projection: whole
    sharded = L * (share - bias) + rest
    state = sharded // 2 + L * bias
    assert (state, share - bias, rest) == (2864, 1136, 992)  # the sums above, once in numbers
    assert r["gradients"] == 4 * state and r["adam_moments"] == 2 * 4 * state
    assert r["weights"] == 4 * (state + max(share - bias, rest))
    tp_on_2 = parallel_memory(*tiny(), T, B, ranks=2, micro_batches=4)["tp"]
    assert r["activations"] == tp_on_2["activations"] // 2
    assert r["total"] == r["weights"] + 3 * r["gradients"] + r["activations"]
    assert parallel_memory(*tiny(), T, B, ranks=4, micro_batches=4, tensor_parallel=3)["fsdp+tp"] == {
        **dict.fromkeys(NUMBERS),
        "refused": "train.strategy fsdp+tp: train.tensor_parallel (3) must divide the torchrun ranks (4)",
    }


def test_fsdp_tp_row_needs_a_tensor_parallel_size_dividing_the_ranks_on_the_cli(tmp_path):
    config = tmp_path / "m.yaml"
    config.write_text(
        json.dumps(
            {
                "model": {
                    "arch": "decoder_lm",
                    "stack": {"d_model": D, "n_heads": H, "n_layers": L, "d_ff": FF},
                    "embeddings": {"tie": "none"},
                },
                "shape": {"vocab_size": V},
            }
        )
    )
    done = run_cli(
        "info", str(config), "--parallel", "4", "--tensor-parallel", "2", "--seq-len", str(T), "--batch", str(B)
    )
    assert done.returncode == 0, done.stderr
    assert "fsdp+tp: tp 2 x dp 2" in done.stdout and "\n  fsdp+tp " in done.stdout
    refused = run_cli("info", str(config), "--parallel", "4", "--tensor-parallel", "3")
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1
    assert "--tensor-parallel (3) must divide --parallel (4)" in refused.stderr


@pytest.mark.parametrize(
    "arch, first_stage",
    [
        ("encoder_only", ("embed.", "encoder.layers.0.")),
        ("encoder_decoder", ("src_embed.", "encoder.", "tgt_embed.")),
    ],
)
def test_pp_row_holds_the_heavier_stage_of_each_family_cut(arch, first_stage):
    """2 layers on 2 stages. Encoder-only: the first holds the embeddings and layer 0, the last
    layer 1 and both heads (the masked-LM head and the classifier, which the model keeps whichever
    a task reads). Encoder-decoder (1 + 1 layers): the first the source embedding, the encoder and,
    where the memory is made, the target embedding; the last the decoder layer, its norm and the
    output projection."""
    cfg, shape = sized(
        arch=arch,
        vocab_size=V,
        stack=dict(d_model=D, n_heads=H, n_layers=2 if arch == "encoder_only" else 1, d_ff=FF),
        embeddings=dict(tie="none"),
    )
    sizes = {name: p.numel() for name, p in build_model(cfg, shape).named_parameters()}
    first = sum(n for name, n in sizes.items() if name.startswith(first_stage))
    last = sum(sizes.values()) - first
    assert parallel_memory(cfg, shape, T, B, 2, 2)["pp gpipe"]["gradients"] == 4 * max(first, last)


def test_a_layout_training_refuses_is_n_a_with_the_strategy_s_own_reason(tmp_path):
    """3 ranks of a 4-head model (issue 64): tp is n/a (training refuses n_heads 4 on 3 ranks), not a
    memory figure for a layout that cannot train; pp says why it is n/a; --parallel 3 alone works,
    fsdp+tp n/a at the default tensor-parallel size 2."""
    report = parallel_memory(*tiny(), T, B, ranks=3, micro_batches=3)
    assert report["tp"] == {
        **dict.fromkeys(NUMBERS),
        "refused": f"train.strategy tp: model.stack.n_heads ({H}) must "
        f"be divisible by the tensor-parallel size (3 ranks)",
    }
    assert report["ddp"]["total"] is not None and "refused" not in report["ddp"]
    config = tmp_path / "m.yaml"
    config.write_text(
        json.dumps(
            {
                "model": {
                    "arch": "decoder_lm",
                    "stack": {"d_model": D, "n_heads": H, "n_layers": L, "d_ff": FF},
                    "embeddings": {"tie": "all"},
                },
                "shape": {"vocab_size": V},
            }
        )
    )
    done = run_cli("info", str(config), "--parallel", "3", "--seq-len", str(T), "--batch", str(B))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        f"  n/a (tp): train.strategy tp: model.stack.n_heads ({H}) must be divisible by the tensor-parallel size "
        f"(3 ranks)" in lines
    )
    assert (
        "  n/a (pp gpipe, pp 1f1b): train.strategy pp: model.embeddings.tie 'all' shares the first stage's "
        "embedding with the last stage's output projection; set it to none" in lines
    )
    assert (
        "  n/a (fsdp+tp): train.strategy fsdp+tp: train.tensor_parallel (2) must divide the torchrun ranks (3)" in lines
    )
    assert any(line.endswith("fsdp+tp: tp 2; meta device)") for line in lines)
    as_json = json.loads(run_cli("info", str(config), "--parallel", "3", "--json").stdout)
    assert as_json["parallel_memory"]["tp"]["refused"].startswith("train.strategy tp: model.stack.n_heads")
