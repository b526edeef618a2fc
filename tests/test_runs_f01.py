"""Run directories written before configs were composed (tests/fixtures/runs_f01/, made by
docs/experiments/runs_f01_fixture.py with that day's code: a flat model section) load, decode and
resume as they did then."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from attnlab import ConfigError, model_config
from attnlab.models.shape import SIZES, DataShape
from attnlab.runs.checkpoint import load_run
from attnlab.runs.config import RunConfig
from attnlab.runs.migration import MOVED_TO_BACKENDS, MOVED_TO_POSITIONS, migrated_model, refuse_moved, written_sizes
from attnlab.runs.run_dir import RunDir

from helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "runs_f01"
RUNS = ("encoder_decoder", "vit")


def fixture_script():
    spec = importlib.util.spec_from_file_location("runs_f01_fixture", ROOT / "docs/experiments/runs_f01_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.expected.json").read_text())


@pytest.mark.parametrize("name", RUNS)
def test_an_old_run_decodes_the_fixed_inputs_as_it_did_when_written(name):
    recorded = expected(name)["decoded"]
    now = fixture_script().decoded(FIXTURES / name)
    assert now["logits_sum"] == pytest.approx(recorded["logits_sum"], abs=1e-5)
    if name == "vit":
        torch.testing.assert_close(
            torch.tensor(now["probabilities"]), torch.tensor(recorded["probabilities"]), atol=1e-6, rtol=0
        )
    else:
        torch.testing.assert_close(
            torch.tensor(now["logits_first"]), torch.tensor(recorded["logits_first"]), atol=1e-5, rtol=0
        )
        assert now["translations"] == recorded["translations"] == "w w w\nk k k\n"


def test_an_old_run_resumes_one_step_as_it_did_when_written(tmp_path):
    run = tmp_path / "encoder_decoder"
    shutil.copytree(FIXTURES / "encoder_decoder", run)
    done = run_cli("train", "--out", str(run), "--resume", "--allow-changes", "--set", "train.max_steps=3")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("split") == "train"]
    recorded = expected("encoder_decoder")["resumed"]
    assert len(losses) == 3 and losses[2] == pytest.approx(recorded["step3_loss"], abs=1e-6)
    model, _, _ = load_run(run, "last")
    # Adam divides each gradient by its running scale, so where a gradient is near zero a CPU's rounding
    # moves the weight by up to the lr: the sum measured 72.0203 on an AVX-512/AMX Xeon against the
    # 72.0191 recorded on the AVX2 one that wrote the fixture. A resume that lost Adam's moments gives 72.419.
    assert sum(p.double().sum().item() for p in model.parameters()) == pytest.approx(
        recorded["weights_sum_after"], abs=1e-2
    )


@pytest.mark.parametrize("name", RUNS)
def test_the_fixtures_config_is_the_flat_schema_of_its_day(name):
    """The fixture keeps what it is meant to test: a model section with the data's sizes in it."""
    model = yaml.safe_load((FIXTURES / name / "config.yaml").read_text())["model"]
    assert model["arch"] == name and "stack" in model
    assert ("vocab_size" in model) if name == "encoder_decoder" else ({"image_height", "n_classes"} <= set(model))


def test_the_one_migration_moves_the_flat_backend_and_stack_fields_of_an_old_run():
    """The encoder_decoder fixture's model section (today's layout at the time) through runs/migration.py:
    the backends' options land in ``backends``, each at its new path, the data's sizes leave it for the
    run's DataShape, and the rest is unchanged."""
    written = yaml.safe_load((FIXTURES / "encoder_decoder" / "config.yaml").read_text())["model"]
    written = {**written, "attention_window": 7, "sparse_random": 2, "linear_features": "favor", "attention_block": 9}
    migrated = migrated_model(written)
    assert migrated["backends"] == {
        "block": 9,
        "chunked": {"key_block": 1024},
        "pattern": {"window": 7, "stride": 0, "n_global": 0, "n_random": 2},
        "linear": {"feature_map": "favor", "random_features": 64},
    }
    assert migrated["depths"] == {"encoder": None, "decoder": None}  # n_encoder_layers, n_decoder_layers
    switches = ("normalisation", "residual", "ffn", "attention_scale")  # the ablation switches: the stack's now
    assert migrated["stack"] == {
        **written["stack"],
        "normalisation": "layer",
        "residual": True,
        "ffn": True,
        "attention_scale": "sqrt_dk",
    }
    assert migrated["output"] == {"bias": False, "vocabulary": "all"}  # output_bias, output_vocabulary
    assert migrated["embeddings"] == {
        "kind": written["embedding"],
        "tie": written["tie_embeddings"],
        "vocab_multiple": written["vocab_multiple"],
    }
    assert migrated["positions"] == {new: written[old] for old, new in MOVED_TO_POSITIONS.items()}
    assert {
        k: v
        for k, v in migrated.items()
        if k not in ("backends", "depths", "stack", "output", "embeddings", "positions")
    } == {
        k: v
        for k, v in written.items()
        if k
        not in {
            *MOVED_TO_BACKENDS,
            *SIZES,
            *switches,
            "stack",
            "n_encoder_layers",
            "n_decoder_layers",
            "output_bias",
            "output_vocabulary",
            "embedding",
            "tie_embeddings",
            "vocab_multiple",
            *MOVED_TO_POSITIONS,
        }
    }
    assert written_sizes(written) == DataShape(vocab_size=written["vocab_size"], pad_id=0)
    assert RunDir(FIXTURES / "encoder_decoder").read_shape() == written_sizes(
        written
    )  # no shape.json: its config.yaml's
    cfg = model_config(
        migrated_model(
            {**written, "stack": {**written["stack"], "attention_backend": "sparse"}, "linear_features": "elu"}
        )
    )
    assert (
        cfg.backends.pattern.window == 7 and cfg.backends.block == 9 and migrated_model(cfg.to_dict()) == cfg.to_dict()
    )
    # the flat stack fields of the layout before the stack had its config move into ``stack``
    assert migrated_model({"arch": "decoder_lm", "vocab_size": 5, "d_model": 8, "attention_key_block": 4}) == {
        "arch": "decoder_lm",
        "stack": {"d_model": 8},
        "backends": {"chunked": {"key_block": 4}},
    }
    # the vit fixture's patch size and (ViT's own) positional scheme land in ``patches``, its pooling
    # and head in ``classifier``; a captioner's positional places its tokens, in ``positions`` now
    vit = yaml.safe_load((FIXTURES / "vit" / "config.yaml").read_text())["model"]
    assert (vit["patch_size"], vit["positional"], vit["pooling"], vit["head"]) == (4, "learned", "cls", "pooled")
    assert migrated_model(vit) == {
        **{k: v for k, v in vit.items() if k not in ("patch_size", "positional", "pooling", "head", *SIZES)},
        "patches": {"size": 4, "positional": "learned"},
        "classifier": {"pooling": "cls", "head": "pooled"},
    }
    assert written_sizes(vit) == DataShape(channels=1, image_height=8, image_width=8, n_classes=10)
    captioner = {
        "arch": "captioner",
        "vocab_size": 9,
        "patch_size": 8,
        "patch_positional": "none",
        "positional": "rotary",
    }
    assert migrated_model(captioner) == {
        "arch": "captioner",
        "patches": {"size": 8, "positional": "none"},
        "positions": {"scheme": "rotary"},
    }
    # a value already in the new place (an old run's info with --set model.backends...) wins over the flat one
    assert migrated_model(
        {
            "arch": "decoder_lm",
            "vocab_size": 5,
            "attention_window": 128,
            "sparse_stride": 2,
            "backends": {"pattern": {"window": 3}},
        }
    )["backends"] == {"pattern": {"window": 3, "stride": 2}}
    # a family without backends (release 0.1 wrote the fields for every family): dropped
    assert migrated_model({"arch": "rnn", "vocab_size": 5, "attention_window": 128}) == {"arch": "rnn"}


def test_a_new_config_with_an_old_flat_backend_field_is_refused_naming_the_new_spelling(tmp_path):
    """New config files and --set follow the new layout; an old spelling is one line naming the new one."""
    config = tmp_path / "old.yaml"
    config.write_text(
        "model: {arch: decoder_lm, attention_window: 16, stack: {attention_backend: local}}\n"
        "data: {task: language_model, train: text.txt}\n"
    )
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_file(config)
    assert str(refused.value) == (
        f"{config}: model.attention_window is now model.backends.pattern.window, in a part of its own "
        f"(write backends: {{pattern: {{window: ...}}}}; --set model.backends.pattern.window=...)"
    )
    config.write_text(
        "model: {arch: decoder_lm, stack: {attention_backend: local}}\ndata: {task: language_model, train: text.txt}\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"^--set 'model.sparse_stride=4': model.sparse_stride is now "
        r"model.backends.pattern.stride, in a part of its own",
    ):
        RunConfig.from_file(config, ["model.sparse_stride=4"])
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"), "--set", "model.attention_block=8")
    assert done.returncode != 0 and done.stderr.count("\n") == 1 and "model.backends.block" in done.stderr
    done = run_cli("info", str(FIXTURES / "encoder_decoder"), "--set", "model.n_encoder_layers=2")
    assert done.returncode != 0 and done.stderr == (
        "error: --set 'model.n_encoder_layers=2': model.n_encoder_layers is now model.depths.encoder, in a part of "
        "its own (write depths: {encoder: ...}; --set model.depths.encoder=...)\n"
    )
    done = run_cli("info", str(FIXTURES / "encoder_decoder"), "--set", "model.depths.encoder=2", "--json")
    assert done.returncode == 0 and "encoder.layers.1" in json.loads(done.stdout)["layers"]
    cfg = RunConfig.from_file(config, ["model.backends.pattern.window=16", "model.backends.block=8"])
    assert (cfg.model.backends.pattern.window, cfg.model.backends.block) == (16, 8)


def test_a_new_config_with_the_flat_output_fields_is_refused_naming_output(tmp_path):
    """output_bias and output_vocabulary, the encoder-decoder's and the LM's, are the composed
    ``output`` (models/transformer_config.py: Output) of both and of CMLM."""
    config = tmp_path / "lm.yaml"
    config.write_text(
        "model: {arch: decoder_lm, output_vocabulary: text}\ndata: {task: language_model, train: t.txt}\n"
    )
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_file(config)
    assert str(refused.value) == (
        f"{config}: model.output_vocabulary is now model.output.vocabulary, in a part of its "
        f"own (write output: {{vocabulary: ...}}; --set model.output.vocabulary=...)"
    )
    config.write_text("model: {arch: cmlm}\ndata: {task: masked_translation, train: t.tsv}\n")
    with pytest.raises(
        ConfigError,
        match=r"^--set 'model.output_bias=true': model.output_bias is now "
        r"model.output.bias, in a part of its own",
    ):
        RunConfig.from_file(config, ["model.output_bias=true"])
    assert migrated_model({"arch": "cmlm", "output_bias": True, "output_vocabulary": "no_bos"}) == {
        "arch": "cmlm",
        "output": {"bias": True, "vocabulary": "no_bos"},
    }
    for arch in ("encoder_decoder", "cmlm", "decoder_lm"):
        cfg = model_config(arch=arch, output={"bias": True})
        assert (cfg.output.bias, cfg.output.vocabulary) == (True, "all")
    # the language model's projection takes the bias too: one per token, added to every logit
    from attnlab.models import build_model
    from attnlab.nn.heads import VocabularyProjection

    small = {"arch": "decoder_lm", "stack": {"d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16}}
    plain, biased = (
        build_model(model_config({**small, "output": {"bias": bias}}), DataShape(vocab_size=11, pad_id=0))
        for bias in (False, True)
    )
    projection = next(m for m in biased.modules() if isinstance(m, VocabularyProjection))
    assert sum(p.numel() for p in biased.parameters()) - sum(p.numel() for p in plain.parameters()) == 11
    with torch.no_grad():
        projection.bias.copy_(torch.arange(11.0))
        h = torch.randn(2, 8)
        torch.testing.assert_close(projection(h), h @ projection.weight.T + torch.arange(11.0))


def test_a_new_config_with_the_flat_position_fields_is_refused_naming_positions(tmp_path):
    """positional, positional_combine, positional_dim, positional_base, max_relative_distance and
    max_len of the Transformer families are the composed ``positions`` (models/transformer_config.py:
    Positions: scheme, combine, dim, base, max_relative_distance, max_len); the recurrent and
    convolutional families keep their own max_len, ViT's positional its patches'."""
    config = tmp_path / "mt.yaml"
    config.write_text("model: {positional: rotary}\ndata: {task: translation, train: t.tsv}\n")
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_file(config)
    assert str(refused.value) == (
        f"{config}: model.positional is now model.positions.scheme, in a part of its own "
        f"(write positions: {{scheme: ...}}; --set model.positions.scheme=...)"
    )
    config.write_text("model: {arch: decoder_lm}\ndata: {task: language_model, train: t.txt}\n")
    with pytest.raises(
        ConfigError,
        match=r"^--set 'model.max_len=64': model.max_len is now model.positions.max_len, in a part of its own "
        r"\(write positions: \{max_len: ...\}; --set model.positions.max_len=...\)$",
    ):
        RunConfig.from_file(config, ["model.max_len=64"])
    assert RunConfig.from_file(config, ["model.positions.max_len=64"]).model.positions.max_len == 64
    assert migrated_model({"arch": "single_stream", "positional_base": 100.0, "max_len": 8}) == {
        "arch": "single_stream",
        "positions": {"base": 100.0, "max_len": 8},
    }
    migrated = model_config(migrated_model({"arch": "single_stream", "max_len": 8}))
    assert (migrated.positions.scheme, migrated.positions.max_len) == ("learned", 8)  # its default scheme kept
    assert migrated_model({"arch": "rnn", "max_len": 8}) == {"arch": "rnn", "max_len": 8}
    assert model_config(arch="rnn", max_len=8).longest_sequence == 8
    assert migrated_model({"arch": "vit", "positional": "sinusoidal_2d"}) == {
        "arch": "vit",
        "patches": {"positional": "sinusoidal_2d"},
    }


def test_a_new_config_with_the_flat_embedding_fields_is_refused_naming_embeddings(tmp_path):
    """embedding, tie_embeddings and vocab_multiple of the Transformer families are the composed
    ``embeddings`` (models/transformer_config.py: TokenEmbeddings: kind, tie, vocab_multiple); the
    recurrent family keeps its own tie_embeddings."""
    config = tmp_path / "mt.yaml"
    config.write_text("model: {tie_embeddings: none}\ndata: {task: translation, train: t.tsv}\n")
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_file(config)
    assert str(refused.value) == (
        f"{config}: model.tie_embeddings is now model.embeddings.tie, in a part of its own "
        f"(write embeddings: {{tie: ...}}; --set model.embeddings.tie=...)"
    )
    config.write_text("model: {arch: decoder_lm}\ndata: {task: language_model, train: t.txt}\n")
    with pytest.raises(
        ConfigError,
        match=r"^--set 'model.embedding=plain': model.embedding is now "
        r"model.embeddings.kind, in a part of its own",
    ):
        RunConfig.from_file(config, ["model.embedding=plain"])
    assert migrated_model({"arch": "captioner", "embedding": "plain", "vocab_multiple": 8}) == {
        "arch": "captioner",
        "embeddings": {"kind": "plain", "vocab_multiple": 8},
    }
    assert model_config(arch="captioner", embeddings={"kind": "plain"}).embeddings.tie == "output"  # its default kept
    assert model_config(arch="rnn", tie_embeddings="none").tied == ()


def test_a_new_vit_config_with_the_flat_patch_fields_is_refused_naming_patches(tmp_path):
    config = tmp_path / "vit.yaml"
    config.write_text(
        "model: {arch: vit, patch_size: 2}\ndata: {task: image_classification, images: {dataset: digits}}\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"model.patch_size is now model.patches.size, in a part of its own \(write "
        r"patches: \{size: ...\}; --set model.patches.size=...\)$",
    ):
        RunConfig.from_file(config)
    config.write_text("model: {arch: vit}\ndata: {task: image_classification, images: {dataset: digits}}\n")
    with pytest.raises(
        ConfigError,
        match=r"^--set 'model.positional=none': model.positional is now "
        r"model.patches.positional",
    ):
        RunConfig.from_file(config, ["model.positional=none"])
    assert RunConfig.from_file(config, ["model.patches.positional=none", "model.patches.size=2"]).model == model_config(
        {"arch": "vit", "patches": {"positional": "none", "size": 2}}
    )


@pytest.mark.parametrize("arch", ["vit", "encoder_only", "single_stream"])
def test_a_new_config_with_the_flat_classifier_fields_is_refused_naming_classifier(arch):
    with pytest.raises(
        ConfigError,
        match=r"^--set 'model.pooling=mean': model.pooling is now model.classifier.pooling, in a part of its own "
        r"\(write classifier: \{pooling: ...\}; --set model.classifier.pooling=...\)$",
    ):
        refuse_moved(arch, ["pooling"], "--set 'model.pooling=mean': ")
    with pytest.raises(ConfigError, match=r"model.head is now model.classifier.head"):
        refuse_moved(arch, ["head"])
    # an old run's flat fields migrate into the part (the vit fixture above, written with them, loads)
    assert migrated_model({"arch": arch, "pooling": "mean", "head": "linear"}) == {
        "arch": arch,
        "classifier": {"pooling": "mean", "head": "linear"},
    }
