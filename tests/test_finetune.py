"""Fine-tuning from a checkpoint (train.init_from): what is loaded, new and unused, reported and
recorded; frozen parts that stay fixed; layer-wise learning-rate decay and the warm-up ratio."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from attnlab.errors import ConfigError
from attnlab.models import build_model
from attnlab.runs.init import grouped
from attnlab.runs.train_config import TrainConfig
from attnlab.train.schedules import make_scheduler
from attnlab.train.step import freeze, layer_lr_scales, make_optimizer

from helpers import run_cli, sized

WORDS = "zero one two three four five six seven eight nine ten eleven".split()

PRETRAIN = """\
model: {{arch: encoder_only, stack: {{d_model: 32, n_heads: 2, n_layers: 2, d_ff: 64, dropout: 0.0}}, positions: {{scheme: learned,
        max_len: 16}}}}
data: {{task: masked_lm, train: {root}/count.txt, max_len: 16, splits: {{n_valid: 50}}}}
train: {{max_steps: 20, max_tokens: 512, lr_schedule: constant, lr: 3.0e-3, warmup_steps: 1, eval_every: 20,
        label_smoothing: 0.0, progress: false}}
"""

FINETUNE = """\
model: {{stack: {{dropout: 0.0{stack}}}{model}}}
data: {{task: classification, train: {root}/parity.tsv, max_len: 16, splits: {{n_valid: 40}}}}
train: {{init_from: {init_from}, max_steps: 10, max_tokens: 512, lr_schedule: cosine, lr: 1.0e-3, warmup_ratio: 0.2,
        eval_every: 10, label_smoothing: 0.0, progress: false, early_stop_metric: accuracy{extra}}}
"""


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A masked-LM run on counting text, and labelled lines of the same words."""
    root = tmp_path_factory.mktemp("finetune")
    rng = random.Random(0)
    (root / "count.txt").write_text(
        "".join(" ".join(WORDS[(s + i) % 12] for i in range(6)) + "\n" for s in [rng.randrange(12) for _ in range(300)])
    )
    (root / "parity.tsv").write_text(
        "".join(
            " ".join(WORDS[(s + k) % 12] for k in range(5))
            + f" {'zero' if i % 2 else 'one'}\t{'even' if i % 2 else 'odd'}\n"
            for i, s in enumerate(rng.randrange(12) for _ in range(200))
        )
    )
    (root / "pretrain.yaml").write_text(PRETRAIN.format(root=root))
    done = run_cli("train", str(root / "pretrain.yaml"), "--out", str(root / "mlm"))
    assert done.returncode == 0, done.stderr
    return root


def finetune(root, name: str, init_from: str = "mlm", extra: str = "", model: str = "", stack: str = ""):
    """Train run ``name`` of ``root`` from ``init_from`` (a path under ``root``)."""
    (root / f"{name}.yaml").write_text(
        FINETUNE.format(root=root, init_from=root / init_from, extra=extra, model=model, stack=stack)
    )
    return run_cli("train", str(root / f"{name}.yaml"), "--out", str(root / name))


def test_a_classifier_starts_from_a_masked_lm_run_and_changes_only_what_it_trains(pretrained):
    root = pretrained
    done = finetune(root, "ft", extra=", freeze_embeddings: true, freeze_layers: 1")
    assert done.returncode == 0, done.stderr
    lines = [line.replace(str(root) + "/", "") for line in done.stdout.splitlines()]
    assert (
        "init_from mlm: loaded 31 tensors: embed.tokens, embed.positional.table, encoder.layers.0-1, "
        "mlm_head.bias, mlm_head.transform, mlm_head.norm"
    ) in lines
    assert "init_from mlm: initialised new 4 tensors: classifier.pool, classifier.out" in lines
    assert "init_from mlm: unused 0 tensors" in lines
    assert "frozen 14 tensors: embed.tokens, embed.positional.table, encoder.layers.0" in lines
    report = json.loads((root / "ft" / "init.json").read_text())
    assert report["new"] == [
        "classifier.pool.weight",
        "classifier.pool.bias",
        "classifier.out.weight",
        "classifier.out.bias",
    ]
    assert report["untrained"] == []  # its masked-LM head holds the pre-trained values
    # the model section is the pre-trained run's, with this config's dropout
    config = (root / "ft" / "config.yaml").read_text()
    assert "d_model: 32" in config and "n_layers: 2" in config and "task: classification" in config
    assert (root / "ft" / "tokenizer-src.json").read_text() == (root / "mlm" / "tokenizer-src.json").read_text()
    before = load_file(str(root / "mlm" / "checkpoints" / "step-000020" / "model.safetensors"))
    after = load_file(str(root / "ft" / "checkpoints" / "step-000010" / "model.safetensors"))
    unchanged = {name for name in after if name in before and torch.equal(after[name], before[name])}
    frozen = {n for n in after if n.startswith(("embed.", "encoder.layers.0."))}
    mlm_head = {n for n in after if n.startswith("mlm_head.")}  # the classification loss never reaches it
    assert unchanged == frozen | mlm_head
    assert all(not torch.equal(after[n], before[n]) for n in after if n.startswith("encoder.layers.1."))
    # `info` on the fine-tuning config counts the model exactly: the vocabulary is the source run's
    info = run_cli("info", str(root / "ft.yaml"))
    assert (
        info.returncode == 0
        and "vocab 17\n" in info.stdout
        and "parameters                          20,403\n" in info.stdout
    )


def test_a_run_started_from_a_classifier_skips_its_untrained_masked_lm_head(pretrained):
    root = pretrained
    # a classifier trained from scratch never trains its masked-LM head: a run from it does not load it
    (root / "scratch.yaml").write_text(
        FINETUNE.format(
            root=root,
            init_from="x",
            extra="",
            model=", arch: encoder_only, positions: {scheme: learned, max_len: 16}",
            stack=", d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64",
        ).replace("init_from: x, ", "")
    )
    assert run_cli("train", str(root / "scratch.yaml"), "--out", str(root / "scratch")).returncode == 0
    done = finetune(root, "again", init_from="scratch/checkpoints/step-000010")
    assert done.returncode == 0, done.stderr
    assert (
        f"init_from {root}/scratch/checkpoints/step-000010: initialised new 5 tensors: mlm_head.bias, "
        "mlm_head.transform, mlm_head.norm"
    ) in done.stdout.splitlines()
    assert json.loads((root / "again" / "init.json").read_text())["untrained"] == [
        "mlm_head.bias",
        "mlm_head.transform.weight",
        "mlm_head.transform.bias",
        "mlm_head.norm.weight",
        "mlm_head.norm.bias",
    ]


@pytest.mark.parametrize(
    "init_from,extra,model,stack,message",
    [
        (
            "nowhere",
            "",
            "",
            "",
            "train.init_from: nowhere is neither a run directory (with config.yaml) nor one of its "
            "checkpoint directories (with model.safetensors)",
        ),
        (
            "mlm",
            "",
            ", arch: decoder_lm",
            "",
            "train.init_from: mlm is a run of model.arch 'encoder_only'; this config's "
            "model.arch is 'decoder_lm': weights initialise a model of their own family only",
        ),
        (
            "mlm",
            "",
            "",
            ", d_model: 64",
            "train.init_from mlm: embed.tokens.weight has shape (17, 32) there and (17, 64) here",
        ),
        ("mlm", ", freeze_layers: 3", "", "", "train.freeze_layers (3) is more than the model's 2 layers"),
    ],
)
def test_bad_initialisation_is_one_line(pretrained, init_from, extra, model, stack, message):
    done = finetune(pretrained, "bad", init_from=init_from, extra=extra, model=model, stack=stack)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert message in done.stderr.replace(f"{pretrained}/", "")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (pretrained / "bad").exists()  # refused before anything was written


@pytest.mark.parametrize("task,what", [("classification", "a TSV file"), ("masked_lm", "a text file")])
def test_a_training_config_needs_training_data(task, what):
    """A run's own config may lack it (an imported run); a config to train from may not."""
    from attnlab.runs.config import RunConfig

    with pytest.raises(ConfigError, match=rf"^data.task '{task}' needs 'train' \({what}\)$"):
        RunConfig.from_sections({"model": {"arch": "encoder_only"}, "data": {"task": task}})


def test_freezing_needs_init_from_and_the_warmup_ratio_replaces_warmup_steps():
    with pytest.raises(ConfigError, match="freeze_embeddings and freeze_layers keep pre-trained weights fixed"):
        TrainConfig(freeze_layers=1)
    with pytest.raises(ConfigError, match=r"set warmup_steps \(100\) or warmup_ratio \(0.1\), not both"):
        TrainConfig(warmup_steps=100, warmup_ratio=0.1, lr_schedule="cosine")
    assert TrainConfig(max_steps=1000, warmup_ratio=0.06, lr_schedule="cosine").warmup == 60
    assert TrainConfig(max_steps=1000, warmup_steps=50).warmup == 50


def test_layer_wise_learning_rate_decay_and_frozen_layers():
    torch.manual_seed(0)
    model = build_model(
        *sized(
            {
                "arch": "encoder_only",
                "vocab_size": 20,
                "stack": {"d_model": 8, "n_heads": 2, "n_layers": 3, "d_ff": 16},
                "positions": {"scheme": "learned", "max_len": 8},
            }
        )
    )
    scales = layer_lr_scales(model, 0.5)
    assert scales["embed.tokens.weight"] == scales["embed.positional.table.weight"] == 0.5**4
    assert [scales[f"encoder.layers.{i}.feed_forward.w_1.weight"] for i in range(3)] == [0.5**3, 0.5**2, 0.5]
    assert scales["classifier.out.weight"] == scales["mlm_head.norm.bias"] == 1.0
    frozen = freeze(model, embeddings=True, first_layers=1)
    assert grouped(frozen) == "embed.tokens, embed.positional.table, encoder.layers.0"
    cfg = TrainConfig(
        optimizer="adamw",
        weight_decay=0.01,
        lr_schedule="constant",
        lr=2.0,
        warmup_steps=0,
        layer_lr_decay=0.5,
        init_from="x",
        freeze_layers=1,
    )
    optimizer = make_optimizer(model, cfg)
    scheduler = make_scheduler(optimizer, lambda k: 2.0)
    by_scale = {(g["lr_scale"], g["weight_decay"]): (g["lr"], len(g["params"])) for g in optimizer.param_groups}
    # layers 1 and 2 (4 matrices, 8 vectors each: attention, FFN, two norms), the heads (3 matrices, 6 vectors)
    assert by_scale == {
        (0.25, 0.01): (0.5, 4),
        (0.25, 0.0): (0.5, 8),
        (0.5, 0.01): (1.0, 4),
        (0.5, 0.0): (1.0, 8),
        (1.0, 0.01): (2.0, 3),
        (1.0, 0.0): (2.0, 6),
    }
    trained = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert not any(
        id(p) in trained for n, p in model.named_parameters() if n.startswith(("embed.", "encoder.layers.0."))
    )
    assert scheduler.get_last_lr() == [g["lr"] for g in optimizer.param_groups]
