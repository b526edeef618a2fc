"""Model configs: validation that names the field and the valid values, and the YAML/JSON round trip."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import ClassVar, Literal

import pytest

from attnlab import ConfigError, model_config
from attnlab.config import TypedConfig
from attnlab.models import StackConfig, read_model_config
from attnlab.models.shape import DataShape
from attnlab.runs.migration import migrated_model, written_sizes

import golden
from helpers import RECURRENT_PRESET, RECURRENT_SETS, sized, without_dropout


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(stack=dict(d_model=510, n_heads=8)), r"d_model \(510\) must be divisible by n_heads \(8\)"),
        (dict(stack=dict(norm="mid")), r"norm must be one of 'post', 'pre' \(got 'mid'\)"),
        (
            dict(positions=dict(scheme="rotery")),
            r"^positions.scheme must be one of .*'rotary'.* \(got 'rotery'\) \(did you mean 'rotary'\?\)",
        ),
        (dict(arch="gpt"), r"arch must be one of 'encoder_decoder', 'decoder_lm', 'encoder_only'"),
        (dict(stack=dict(activation="tanh")), r"activation must be one of 'relu', 'gelu', 'gelu_tanh', 'silu'"),
        (dict(positions=dict(combine="mul")), r"^positions.combine must be one of 'add', 'concat' \(got 'mul'\)$"),
        (dict(embeddings={"tie": "yes"}), r"embeddings.tie must be one of 'none', 'output', 'src_tgt', 'all'"),
        (
            dict(embeddings={"kind": "big"}),
            r"^embeddings.kind must be one of 'scaled', 'normed', 'plain' \(got 'big'\)$",
        ),
        (dict(embeddings={"vocab_multiple": 0}), r"^embeddings.vocab_multiple must be >= 1 \(got 0\)$"),
        (dict(stack=dict(dropout=1.5)), r"dropout must be in \[0, 1\) \(got 1.5\)"),
        (dict(stack=dict(attention_dropout=-0.1)), r"attention_dropout must be in \[0, 1\)"),
        (dict(stack=dict(d_model=0)), r"d_model must be >= 1 \(got 0\)"),
        (dict(depths=dict(encoder=0)), r"^depths.encoder must be >= 1 \(got 0\)$"),
        (dict(stack=dict(d_model="512")), r"d_model must be an integer \(got '512'\)"),
        (dict(stack=dict(d_model=True)), r"d_model must be an integer \(got True\)"),
        (dict(stack=dict(dropout="0.1")), r"dropout must be a number"),
        (dict(src_vocab_size=50), r"src_vocab_size \(50\) must equal vocab_size \(100\)"),
        (
            dict(positions=dict(scheme="rotary"), stack=dict(d_model=24, n_heads=8)),
            r"rotary positions need an even head size",
        ),
        (
            dict(positions=dict(scheme="rotary", combine="concat")),
            r"'concat' needs an absolute encoding",
        ),
        (
            dict(positions=dict(combine="concat", dim=32)),
            r"embeddings.tie 'output'/'all' needs token embeddings",
        ),
        (
            dict(positions=dict(combine="concat", dim=64), embeddings={"tie": "src_tgt"}),
            r"positions.dim \(64\) must be between 1 and d_model - 1",
        ),
        (dict(positions=dict(dim=8)), r"^positions.dim is only used with positions.combine 'concat'$"),
        (
            dict(positions=dict(combine="concat", dim=7), embeddings={"tie": "none"}),
            r"sinusoidal positions need an even width \(got 7\)",
        ),
        (dict(pad_id=100), r"pad_id \(100\) must be a token id below the vocabulary size \(100\)"),
        (
            dict(arch="decoder_lm", output_bias=True),
            r"model.arch 'decoder_lm' has no field 'output_bias' \(did you mean "
            r"'output'\?\); its fields: stack, positions",
        ),
        (
            dict(arch="decoder_lm", output={"vocabulary": "no_bos"}),
            r"^output.vocabulary must be one of 'all', 'text' "
            r"\(got 'no_bos'\)$",
        ),
        (
            dict(arch="vit", output_bias=True),
            r"model.arch 'vit' has no field 'output_bias'; its fields: patches, stack",
        ),
        (
            dict(arch="decoder_lm", embeddings={"tie": "src_tgt"}),
            r"embeddings.tie 'src_tgt' needs arch 'encoder_decoder'",
        ),
        (dict(positions=dict(base=1.0)), r"^positions.base must be > 1 \(got 1.0\)$"),
        (dict(arch="encoder_only", n_classes=1), r"^shape.n_classes must be at least 2 \(got 1\)$"),
        (dict(rnn_cell="lstm"), r"model.arch 'encoder_decoder' has no field 'rnn_cell'"),
        (dict(arch="rnn", n_heads=4), r"model.arch 'rnn' has no field 'n_heads'; its fields: d_model, n_layers"),
        (
            dict(norm="pre"),
            r"model.norm is a field of model.stack: write it inside stack \(stack: \{norm: ...\}; --set "
            r"model.stack.norm=...\)",
        ),
        (dict(stack=dict(layer_norm_eps=float("nan"))), r"layer_norm_eps must be a finite number"),
        (dict(positions=dict(base=float("inf"))), r"^positions.base must be a finite number \(got inf\)$"),
        (
            dict(arch="decoder_lm", n_encoder_layers=2),
            r"model.arch 'decoder_lm' has no field 'n_encoder_layers' \(did you "
            r"mean 'stack.n_layers'\?\)",
        ),
        (dict(arch="encoder_only", n_decoder_layers=2), r"model.arch 'encoder_only' has no field 'n_decoder_layers'"),
    ],
)
def test_invalid_configs_name_the_field(overrides, message):
    """A model config's own fields, and its checks of the data's sizes (vocab_size 100 unless overridden)."""
    fields = {"vocab_size": 100, **overrides}
    if overrides.get("arch") != "rnn":  # a family with an attention stack: d_model 64, 4 heads unless overridden
        fields["stack"] = {"d_model": 64, "n_heads": 4, **overrides.get("stack", {})}
    with pytest.raises(ConfigError, match=message):
        sized(**fields)


@pytest.mark.parametrize("size", ["vocab_size", "pad_id", "n_classes", "image_height", "horizon", "segment_length"])
def test_a_size_the_data_decides_is_refused_in_a_model_section(size):
    """The sizes are the DataShape's (models/shape.py), handed to the builder: one line says so."""
    with pytest.raises(ConfigError, match=rf"^model.{size} is set by the data, not the model section: remove it$"):
        model_config(arch="decoder_lm", **{size: 8})


def test_the_data_shape_checks_its_sizes_and_reads_and_writes_shape_json(tmp_path):
    shape = DataShape(vocab_size=100, src_vocab_size=80, n_classes=3)
    assert (shape.src_vocab, shape.vocab_sizes, DataShape(vocab_size=7).src_vocab) == (80, (100, 80), 7)
    (tmp_path / "shape.json").write_text(shape.to_json())
    assert DataShape.read(tmp_path / "shape.json") == shape
    assert shape.to_dict() == {"vocab_size": 100, "src_vocab_size": 80, "pad_id": 0, "n_classes": 3}
    assert DataShape(n_classes=2).with_vocabulary(9) == DataShape(vocab_size=9, n_classes=2)
    with pytest.raises(ConfigError, match=r"^shape.vocab_size must be at least 1 \(got 0\)$"):
        DataShape(vocab_size=0)
    with pytest.raises(ConfigError, match=r"^shape.channels must be an integer \(got '3'\)$"):
        DataShape(channels="3")
    # what holds whatever family reads the shape is the shape's own check, not each family's
    with pytest.raises(ConfigError, match=r"^shape.n_classes must be at least 2 \(got 1\)$"):
        DataShape(n_classes=1)
    with pytest.raises(ConfigError, match=r"^pad_id \(7\) must be a token id below the vocabulary size \(5\)$"):
        DataShape(vocab_size=9, src_vocab_size=5, pad_id=7)
    with pytest.raises(ConfigError, match=r"^shape: unknown size 'vocab' \(one of channels, horizon, "):
        DataShape.from_dict({"vocab": 3})
    with pytest.raises(ConfigError, match=r"^arch 'vit' needs n_classes from its data, which gives none$"):
        DataShape(vocab_size=3).need("n_classes", "arch 'vit'")


def test_a_stack_mapping_overrides_the_familys_defaults_field_by_field():
    vit, _ = sized(
        arch="vit", image_height=8, image_width=8, channels=1, n_classes=10, patches=dict(size=2), stack={"n_layers": 4}
    )
    assert vit.stack == StackConfig(
        d_model=192, n_heads=3, n_layers=4, d_ff=768, activation="gelu", norm="pre", layer_norm_eps=1e-6
    )  # ViT's defaults, 4 layers
    assert model_config(vit.to_dict()) == vit and vit.to_dict()["stack"]["d_model"] == 192
    assert model_config(arch="decoder_lm").stack == StackConfig()  # the paper's base model
    # a run directory written before the stack had its own config lists its fields flat
    written = {"arch": "decoder_lm", "vocab_size": 10, "d_model": 64, "n_heads": 4, "positional": "rotary"}
    old = model_config(migrated_model(written))
    assert old.stack == StackConfig(d_model=64, n_heads=4) and old.positions.scheme == "rotary"


def test_a_recurrent_model_shares_no_embedding_between_source_and_target():
    with pytest.raises(ConfigError, match=r"tie_embeddings 'src_tgt' needs arch 'encoder_decoder' \(arch is 'rnn'\)"):
        model_config(arch="rnn", tie_embeddings="src_tgt")


def test_a_run_directory_of_release_0_1_lists_every_familys_fields_and_loads():
    """Release 0.1 wrote all 37 fields of its one ModelConfig for every arch; the fields another
    family owns never reached the builder, so they are dropped; any other unknown field is refused."""
    written = {
        "vocab_size": 30,
        "arch": "rnn",
        "n_heads": 1,
        "d_ff": 2048,
        "positional": "sinusoidal",
        "n_classes": 2,
        "attention_backend": "math",
        "d_model": 32,
        "rnn_cell": "lstm",
    }
    cfg = model_config(migrated_model(written))
    assert (cfg.arch, cfg.stack.d_model, cfg.rnn_cell) == ("rnn", 32, "lstm")
    assert written_sizes(written) == DataShape(vocab_size=30, n_classes=2)  # the data's sizes: its DataShape
    with pytest.raises(ConfigError, match="has no field 'n_heads'"):
        model_config({k: v for k, v in written.items() if k not in ("vocab_size", "n_classes")})
    with pytest.raises(ConfigError, match="model.arch 'rnn' has no field 'colour'"):
        model_config(migrated_model({**written, "colour": "blue"}))


RELEASE_0_1_DATA = {
    "format": "text",
    "task": "scan",
    "train": "input.txt",
    "valid": None,
    "test": None,
    "src_lang": None,
    "tgt_lang": None,
    "tokenizer": "char",
    "vocab_size": 8000,
    "shared_vocab": True,
    "max_src_len": 256,
    "max_tgt_len": 256,
    "seed": 1234,
    "n_train": None,
    "n_valid": 500,
    "n_test": 1000,
    "min_len": 3,
    "max_len": 12,
    "block_size": 64,
    "valid_fraction": 0.1,
}


def test_a_run_directory_of_release_0_1_lists_every_data_field_and_loads():
    """Release 0.1 wrote all 20 fields of its one DataConfig, with the generator as 'task' (default
    'scan' for every format): read from a run directory, the generator moves to 'generator' and the
    fields the task does not have go; a config the user writes that way gets the one-line fix."""
    from attnlab.runs.migration import migrated_data
    from attnlab.tasks import LanguageModelConfig, TranslationConfig, task_config
    from attnlab.tasks.language_model import Windows
    from attnlab.tasks.pairs_section import PairGenerator
    from attnlab.tasks.parts import Files, Splits, Text

    lm = task_config(migrated_data(RELEASE_0_1_DATA))
    assert lm == LanguageModelConfig(
        files=Files(format="text", train="input.txt"), text=Text(tokenizer="char"), windows=Windows(block_size=64)
    )
    assert lm.to_dict() == {
        "task": "language_model",
        "format": "text",
        "train": "input.txt",
        "valid": None,
        "text": {"tokenizer": "char", "vocab_size": 8000},
        "splits": {
            "seed": None,
            "n_train": None,
            "n_valid": None,
            "n_test": None,
            "valid_fraction": 0.1,
            "test_fraction": None,
        },
        "block_size": 64,
    }
    # (n_train: a drawing generator without it drew no training pairs, in 0.1 as now: no such run exists)
    pairs = task_config(
        migrated_data(
            {
                **RELEASE_0_1_DATA,
                "format": "builtin",
                "task": "reverse",
                "tokenizer": "word",
                "train": None,
                "n_train": 100,
            }
        )
    )
    assert pairs == TranslationConfig(
        generator=PairGenerator(name="reverse"), splits=Splits(seed=1234, n_train=100, n_valid=500, n_test=1000)
    )
    assert task_config(migrated_data(pairs.to_dict())) == pairs  # a newer section is read as it is
    with pytest.raises(ConfigError, match="data.task 'language_model' has no field 'colour'"):
        task_config(migrated_data({**RELEASE_0_1_DATA, "colour": "blue"}))
    with pytest.raises(ConfigError, match="'reverse' is a built-in generator: write `generator: {name: reverse}`"):
        task_config({"format": "builtin", "task": "reverse"})


def test_unknown_and_missing_keys():
    with pytest.raises(
        ConfigError, match=r"model.arch 'encoder_decoder' has no field 'd_modle' \(did you mean 'stack.d_model'\?\)"
    ):
        model_config({"d_modle": 64})
    with pytest.raises(ConfigError, match=r"model.vocab_size is set by the data, not the model section"):
        model_config({"vocab_size": 10, "stack": {"d_model": 64}})
    with pytest.raises(ConfigError, match=r"section 'model' must be a mapping"):
        model_config([1, 2])


def test_derived_fields():
    cfg = model_config(stack=dict(d_model=64, n_heads=4, n_layers=3, dropout=0.2), depths=dict(decoder=2))
    assert (cfg.stack.d_head, cfg.encoder_layers, cfg.decoder_layers, cfg.stack.attn_dropout) == (16, 3, 2, 0.2)
    assert model_config(positions=dict(base=100)).positions.base == 100.0  # ints accepted as floats


@pytest.mark.parametrize(
    "cfg",
    [
        model_config(),
        model_config(
            arch="decoder_lm",
            positions=dict(scheme="rotary"),
            stack=dict(norm="pre", activation="gelu", attention_dropout=0.0),
        ),
        model_config(embeddings=dict(tie="output"), depths=dict(encoder=2)),
        model_config(
            embeddings=dict(tie="none"),
            positions=dict(combine="concat", dim=16),
            stack=dict(d_model=64, n_heads=4),
        ),
    ],
)
def test_yaml_and_json_round_trip(tmp_path, cfg):
    (tmp_path / "c.yaml").write_text(cfg.to_yaml())
    (tmp_path / "c.json").write_text(cfg.to_json())
    assert read_model_config(tmp_path / "c.yaml") == cfg
    assert read_model_config(tmp_path / "c.json") == cfg
    assert json.loads(cfg.to_json())["model"] == json.loads(json.dumps(cfg.to_dict()))


def test_file_errors_name_the_file_and_line(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("model:\n  arch: decoder_lm\n  d_model: [64\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: YAML does not parse"):
        read_model_config(bad_yaml)
    typo = tmp_path / "typo.yaml"
    typo.write_text("modle:\n  arch: decoder_lm\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: unknown section 'modle' \(did you mean 'model'\?\)"):
        read_model_config(typo)
    field = tmp_path / "field.yaml"
    field.write_text("model:\n  arch: decoder_lm\n  stack: {norm: middle}\n")
    with pytest.raises(ConfigError, match=r"field.yaml: norm must be one of 'post', 'pre' \(got 'middle'\)"):
        read_model_config(field)
    with pytest.raises(ConfigError, match=r"missing.yaml: no such config file"):
        read_model_config(tmp_path / "missing.yaml")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"model": {"arch": "decoder_lm",}}')
    with pytest.raises(ConfigError, match=r"bad.json:1: JSON does not parse"):
        read_model_config(bad_json)


def test_configs_are_frozen_so_they_stay_valid():
    import dataclasses

    cfg = model_config(stack=dict(d_model=64, n_heads=4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.stack.d_model = 15
    assert dataclasses.replace(cfg, stack=dataclasses.replace(cfg.stack, n_heads=8)).stack.d_head == 8
    with pytest.raises(ConfigError, match="divisible"):
        dataclasses.replace(cfg.stack, d_model=15)


@pytest.mark.parametrize(
    "text,value",
    [
        ("3e-3", 0.003),
        ("1E5", 100000.0),
        ("-2e+3", -2000.0),
        ("1.0e-8", 1e-8),
        (".5", 0.5),
        ("12", 12),
        ("1e", "1e"),
        ("e3", "e3"),
        ("inf", "inf"),
        ("-.inf", -math.inf),
        ("1_000.5", 1000.5),
        ("--.inf", "--.inf"),
        ("+-.inf", "+-.inf"),
        ("+._", "+._"),
        ("._", "._"),
    ],
)
def test_yaml_reads_exponent_floats_as_numbers(text, value):
    """YAML 1.1 (PyYAML's default) reads 3e-3 as a string; configs and --set read it as YAML 1.2 does."""
    from attnlab.config import apply_overrides
    from attnlab.config_files import parse_yaml
    from attnlab.runs.config import override_fields

    assert parse_yaml(text) == value and type(parse_yaml(text)) is type(value)
    sections: dict = {}
    apply_overrides(sections, [f"train.lr={text}"], override_fields)
    assert sections["train"]["lr"] == value


def test_config_file_with_exponent_lr(tmp_path):
    from attnlab.runs.train_config import TrainConfig

    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 3e-4\n  min_lr: 1E-5\n")
    cfg = TrainConfig.from_file(path)
    assert (cfg.lr, cfg.min_lr) == (3e-4, 1e-5)


def test_strings_that_look_like_floats_survive_the_round_trip():
    """What attnlab writes (config.yaml, to_yaml) reads back the same: '1e5' as a path stays a string."""
    from attnlab.config_files import dump_yaml, parse_yaml

    data = {"data": {"train": "1e5", "valid": "2024e1", "tokenizer": "1.10"}, "train": {"lr": 3e-3, "eps": 1e-9}}
    assert parse_yaml(dump_yaml(data)) == data


SHIPPED = Path(__file__).resolve().parent.parent


def shipped_training_configs() -> list[Path]:
    """Every training config the repository ships (configs/ and recipes/): not the sweeps, the model
    sections (configs/transformer_base.yaml, ...) or the fine-tuning recipes, whose init_from is a
    run made first."""
    import yaml

    paths = sorted([*SHIPPED.glob("configs/*.yaml"), *SHIPPED.glob("recipes/**/*.yaml")])
    return [
        p
        for p in paths
        if "data" in (sections := yaml.safe_load(p.read_text())) and "init_from" not in (sections.get("train") or {})
    ]


# The sizes each task's data gives (Task.data_shape's, before the data is read), as each task declared
# them in its `sets` before model_fields (and then data_shape) became the one declaration; pad_id is
# every shape's, 0 unless a vocabulary says otherwise
SET_BY_DATA = {
    "translation": {"vocab_size", "src_vocab_size", "pad_id"},
    "masked_translation": {"vocab_size", "src_vocab_size", "pad_id"},
    "language_model": {"vocab_size", "pad_id"},
    "masked_lm": {"vocab_size", "pad_id"},
    "encoder": {"vocab_size", "pad_id"},
    "classification": {"vocab_size", "n_classes", "pad_id"},
    "segment_language_model": {"vocab_size", "pad_id", "segment_length"},
    "image_classification": {"image_height", "image_width", "channels", "n_classes"},
    "image_encoder": {"image_height", "image_width", "channels", "n_classes"},
    "captioning": {"image_height", "image_width", "channels", "vocab_size", "pad_id"},
    "contrastive": {"image_height", "image_width", "channels", "vocab_size", "pad_id"},
    "visual_qa": {"image_height", "image_width", "channels", "vocab_size", "n_classes", "pad_id"},
    "node_classification": {"n_features", "n_classes"},
    "forecasting": {"n_channels", "input_length", "horizon"},
    "audio_classification": {"sample_rate", "samples", "n_classes"},
    "speech_recognition": {"sample_rate", "samples", "vocab_size", "pad_id"},
}

ETT_HEADER = "date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT\n2016-07-01 00:00:00,5.8,2.0,1.5,0.5,4.2,1.3,30.5\n"


@pytest.mark.parametrize("path", shipped_training_configs(), ids=lambda p: str(p.relative_to(SHIPPED)))
def test_every_shipped_training_config_is_valid(path, tmp_path, monkeypatch):
    """Each reads its data from data/NAME, where `attnlab data get NAME` writes, or from runs/, where
    a step documented before it writes (a distilled corpus, a prepared text); and reads into a
    RunConfig, every field known and checked, whose data gives the sizes of SET_BY_DATA. The
    data is not read, except a series' header (its columns): a fresh clone has no data/, so a CSV
    gets a stand-in with ETT's columns."""
    import yaml

    from attnlab.runs.config import RunConfig

    data = yaml.safe_load(path.read_text())["data"]
    paths = [v for v in data.values() if isinstance(v, str) and "/" in v]  # a built-in generator reads none
    assert all(p.startswith(("data/", "runs/")) for p in paths), paths
    monkeypatch.chdir(tmp_path)
    for csv in (Path(p) for p in paths if p.endswith(".csv")):
        csv.parent.mkdir(parents=True, exist_ok=True)
        csv.write_text(ETT_HEADER)
    cfg = RunConfig.from_file(path)
    given = set(cfg.planned_shape(vocab_size=8).to_dict())
    assert given - {"pad_id"} == SET_BY_DATA[cfg.data.task.name] - {"pad_id", "src_vocab_size"}


def test_cuda_graph_training_is_refused_where_it_would_be_wrong(tmp_path):
    """train.compile 'graphs' needs CUDA, one process and accumulate 1 (the replayed backward reuses
    its gradient buffers); each mistake is one line before any run directory exists."""
    import torch

    from attnlab.errors import ConfigError
    from attnlab.runs.train_config import TrainConfig

    with pytest.raises(ConfigError, match="needs accumulate 1"):
        TrainConfig(compile="graphs", accumulate=2)
    with pytest.raises(ConfigError, match="true, false, auto or graphs"):
        TrainConfig(compile="fast")
    cfg = TrainConfig(compile="graphs")
    with pytest.raises(ConfigError, match="needs a GPU"):
        cfg.check_runs_on(torch.device("cpu"))
    with pytest.raises(ConfigError, match="one process"):
        cfg.check_runs_on(torch.device("cuda"), processes=2)
    cfg.check_runs_on(torch.device("cuda"))  # one process on a GPU: fine
    assert cfg.compiles_on(torch.device("cuda")) and cfg.padding_multiple == 8


def test_train_refuses_cuda_graphs_on_the_cpu_before_making_the_run(tmp_path):
    from helpers import run_cli

    text = tmp_path / "text.txt"
    text.write_text("to be or not to be\n" * 50)
    config = tmp_path / "lm.yaml"
    config.write_text(
        f"model: {{arch: decoder_lm, stack: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 16}}}}\n"
        f"data: {{format: text, train: {text}, text: {{tokenizer: char}}, block_size: 8}}\n"
        f"train: {{device: cpu, compile: graphs}}\n"
    )
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 3 and done.stderr.strip().splitlines() == [
        "error: train.compile 'graphs' replays CUDA graphs: it needs a GPU (the run is on cpu); use true or auto"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("preset", golden.training_presets(), ids=lambda p: p.stem)
def test_the_overrides_of_the_cuda_tests_are_fields_of_their_presets(preset):
    """tests/test_cuda.py runs only on a GPU, so a renamed field would go stale there unseen: its
    overrides of every preset are read here on the CPU (c9f718c moved the Transformer's fields into
    model.stack, and the recurrent presets' GPU tests then exited 3 on an H200)."""
    from attnlab.runs.config import RunConfig

    cfg = RunConfig.from_file(preset, without_dropout(preset))
    assert getattr(cfg.model, "stack", cfg.model).dropout == 0.0 and cfg.train.compile is False


def test_the_recurrent_run_of_the_cuda_tests_reads():
    from attnlab.runs.config import RunConfig

    recurrent = RunConfig.from_file(RECURRENT_PRESET, RECURRENT_SETS)
    assert recurrent.model.to_dict()["d_model"] == 64 and recurrent.train.device == "cuda"


@dataclasses.dataclass(frozen=True)
class Part(TypedConfig):
    section: ClassVar[str] = "part"
    size: int = 1


@dataclasses.dataclass(frozen=True)
class Whole(TypedConfig):
    section: ClassVar[str] = "whole"
    part: Part = Part(size=3)
    unset: Part = dataclasses.field(default_factory=Part)

    def __post_init__(self) -> None:
        self._check_types()


def test_a_mapping_overrides_a_config_inside_a_config_field_by_field_from_its_default():
    assert Whole(part={}).part == Part(size=3) and Whole(part={"size": 5}).part == Part(size=5)
    with pytest.raises(TypeError, match=r"^field 'unset' holds a Part: its default must be one, which a mapping"):
        Whole(unset={"size": 5})  # a default_factory leaves nothing to override: a bug of the config class


def test_model_config_s_docstring_example_runs():
    """Its example named d_model at the top level after the stack's fields moved into ``stack`` (issue 64)."""
    import re

    from attnlab.models import family

    (example,) = re.findall(r"``(model_config\(.*?\))``", family.model_config.__doc__)
    cfg = eval(example, {"model_config": model_config})  # noqa: S307 (the docstring's own text)
    assert (cfg.arch, cfg.stack.d_model) == ("decoder_lm", 64)


def test_the_scenes_flat_fields_are_parts_now_refused_in_one_line_and_migrated_from_a_run():
    """held_out, image_size, noise and max_objects are data.scenes' (tasks/scene_splits.py: Scenes), the
    splits' seed and sizes data.splits' (tasks/parts.py: Splits): a run written before reads them from
    their old places (runs/migration.py: migrated_data); a new config is refused in one line naming
    the new place."""
    from attnlab.runs.config import RunConfig
    from attnlab.runs.migration import migrated_data
    from attnlab.tasks import task_config
    from attnlab.tasks.parts import Splits
    from attnlab.tasks.scene_splits import Scenes

    old = {
        "task": "visual_qa",
        "images": {"dataset": "scenes"},
        "n_train": 300,
        "seed": 3,
        "held_out": "blue circle",
        "noise": 2,
    }
    cfg = task_config(migrated_data(old))
    assert cfg.splits == Splits(seed=3, n_train=300, n_valid=200, n_test=500)  # the others: the scenes' defaults
    assert cfg.scenes == Scenes(held_out="blue circle", image_size=32, noise=2.0, max_objects=3)
    assert cfg.to_dict()["splits"] == {
        "seed": 3,
        "n_train": 300,
        "n_valid": 200,
        "n_test": 500,
        "valid_fraction": None,
        "test_fraction": None,
    }
    assert task_config(migrated_data(cfg.to_dict())) == cfg  # a section in the current layout: unchanged
    with pytest.raises(
        ConfigError,
        match=r"^data.n_train is now data.splits.n_train, in a part of its own "
        r"\(write splits: \{n_train: ...\}; --set data.splits.n_train=...\)$",
    ):
        RunConfig.from_sections({"model": {"arch": "single_stream"}, "data": {"task": "visual_qa", "n_train": 300}})
    with pytest.raises(
        ConfigError, match=r"^--set 'data.held_out=blue circle': data.held_out is now data.scenes.held_out"
    ):
        RunConfig.from_file("recipes/multimodal/visual_qa.yaml", ["data.held_out=blue circle"])
    with pytest.raises(ConfigError, match=r"data.max_objects is a field of data.scenes: write it inside scenes"):
        task_config({"task": "captioning", "images": {"dataset": "scenes"}, "max_objects": 2})
    new = RunConfig.from_file("recipes/multimodal/visual_qa.yaml", ["data.splits.n_train=64", "data.scenes.noise=4"])
    assert (new.data.splits.n_train, new.data.splits.n_valid, new.data.scenes.noise) == (64, 200, 4.0)
    with pytest.raises(ConfigError, match=r"splits.n_valid must be >= 1 \(got 0\)"):
        task_config({"task": "visual_qa", "splits": {"n_valid": 0}})
    with pytest.raises(ConfigError, match=r"splits.n_test must be given \(got null\)"):
        task_config({"task": "visual_qa", "splits": {"n_test": None}})


def test_the_images_flat_fields_are_a_part_and_an_image_encoder_reads_only_it():
    """dataset, colour and resize are data.images' (tasks/parts.py: ImageSource), image classification's
    n_valid and split_seed data.splits' n_valid and seed; the image encoder's section is its images
    alone (it inherited image classification's fields and read none of the others): runs written
    before read as the same config, and a new config's flat spelling is refused naming the part."""
    import yaml

    from attnlab.runs.config import RunConfig
    from attnlab.runs.migration import migrated_data
    from attnlab.tasks import task_config
    from attnlab.tasks.image_encoder import ImageEncoderConfig
    from attnlab.tasks.parts import ImageSource, Splits

    written = yaml.safe_load((Path(__file__).parent / "fixtures/runs_f01/vit/config.yaml").read_text())["data"]
    assert (written["dataset"], written["split_seed"], written["n_valid"]) == ("digits", 0, 100)
    vit = task_config(migrated_data(written))
    assert (vit.images, vit.splits) == (ImageSource(dataset="digits"), Splits(seed=0, n_valid=100))
    assert (vit.files.train, vit.crop_padding, vit.flip) == (None, 0, "none")
    old_encoder = {**written, "task": "image_encoder", "dataset": None, "resize": 224, "colour": "grey"}
    assert task_config(migrated_data(old_encoder)) == ImageEncoderConfig(images=ImageSource(colour="grey", resize=224))
    assert task_config(migrated_data({**written, "split_seed": 7})).splits.seed == 7
    with pytest.raises(ConfigError, match=r"^data.split_seed is now data.splits.seed, in a part of its own"):
        RunConfig.from_sections({"model": {"arch": "vit"}, "data": {"task": "image_classification", "split_seed": 3}})
    with pytest.raises(ConfigError, match=r"^--set 'data.resize=8': data.resize is now data.images.resize"):
        RunConfig.from_file("recipes/digits/vit.yaml", ["data.resize=8"])
    with pytest.raises(
        ConfigError, match=r"images.resize is for image files; dataset 'digits' draws images of one size"
    ):
        task_config({"task": "image_classification", "images": {"dataset": "digits", "resize": 8}})
    with pytest.raises(ConfigError, match=r"images.colour must be one of 'rgb', 'grey' \(got 'blue'\)"):
        task_config({"task": "image_encoder", "images": {"colour": "blue"}})
    with pytest.raises(ConfigError, match=r"images.dataset must be one of 'digits' \(got 'mnist'\)"):
        task_config({"task": "image_classification", "images": {"dataset": "mnist"}})
    with pytest.raises(ConfigError, match=r"images.dataset: visual_qa reads the built-in scenes only"):
        task_config({"task": "visual_qa", "images": {"dataset": None}})


def test_the_text_fields_are_a_part_refused_flat_and_migrated_from_a_run():
    """tokenizer and vocab_size are data.text's (tasks/parts.py: Text), in every task of text; the
    golden SCAN run (release 0.1) and the f01 fixture read them from their flat places."""
    import yaml

    from attnlab.runs.config import RunConfig
    from attnlab.runs.migration import migrated_data
    from attnlab.tasks import task_config
    from attnlab.tasks.parts import Text

    for run in ("golden/scan_run", "fixtures/runs_f01/encoder_decoder"):
        written = yaml.safe_load((Path(__file__).parent / run / "config.yaml").read_text())["data"]
        assert (written["tokenizer"], written["vocab_size"]) == ("word", 8000)
        assert task_config(migrated_data(written)).text == Text(tokenizer="word", vocab_size=8000)
    assert task_config({"task": "encoder"}).text == Text(tokenizer="wordpiece")  # each task's defaults kept
    assert task_config({"task": "visual_qa"}).text == Text(tokenizer="word_nopunct")
    assert task_config({"task": "masked_lm", "text": {"vocab_size": 300}}).text == Text("word", 300)
    with pytest.raises(ConfigError, match=r"^data.vocab_size is now data.text.vocab_size, in a part of its own"):
        RunConfig.from_sections({"model": {"arch": "decoder_lm"}, "data": {"format": "text", "vocab_size": 50}})
    with pytest.raises(ConfigError, match=r"^--set 'data.tokenizer=bpe': data.tokenizer is now data.text.tokenizer"):
        RunConfig.from_file("configs/scan.yaml", ["data.tokenizer=bpe"])
    with pytest.raises(ConfigError, match=r"text.tokenizer must be one of 'char', 'word'.* \(got 'bytes'\)"):
        task_config({"task": "classification", "text": {"tokenizer": "bytes"}})
    with pytest.raises(ConfigError, match=r"text.vocab_size must be >= 1 \(got 0\)"):
        task_config({"task": "captioning", "text": {"vocab_size": 0}})
    cfg = RunConfig.from_file("configs/scan.yaml", ["data.text.vocab_size=300"])
    assert cfg.data.text == Text("word", 300)


def test_translation_composes_its_generator_and_pairs_and_masked_translation_the_same_parts():
    """Translation's generator (its name, lengths, SCAN split) is data.generator (tasks/pairs_section.py:
    PairGenerator), its sides' suffixes, longest sentences and vocabularies data.pairs (Pairs); masked
    translation's section composes the same parts instead of inheriting translation's. The golden
    SCAN run (release 0.1) and the f01 fixture read as the same config."""
    import yaml

    from attnlab.runs.config import RunConfig
    from attnlab.runs.migration import migrated_data
    from attnlab.tasks import task_config
    from attnlab.tasks.pairs_section import PairGenerator, Pairs

    fixture = yaml.safe_load((Path(__file__).parent / "fixtures/runs_f01/encoder_decoder/config.yaml").read_text())
    cfg = task_config(migrated_data(fixture["data"]))
    assert (cfg.generator, cfg.pairs) == (PairGenerator("reverse", 3, 5), Pairs())
    assert (cfg.splits.n_train, cfg.splits.n_valid, cfg.splits.n_test, cfg.splits.seed) == (200, 20, 10, 1234)
    golden = yaml.safe_load((Path(__file__).parent / "golden/scan_run/config.yaml").read_text())["data"]
    assert task_config(migrated_data(golden)).generator == PairGenerator("scan", 3, 12)
    masked = task_config({"task": "masked_translation", **{k: v for k, v in cfg.to_dict().items() if k != "task"}})
    assert (masked.generator, masked.pairs, masked.text) == (cfg.generator, cfg.pairs, cfg.text)
    old = {"task": "masked_translation", "format": "parallel", "src_lang": "de", "tgt_lang": "en", "max_src_len": 9}
    assert task_config(migrated_data(old)).pairs == Pairs(src_lang="de", tgt_lang="en", max_src_len=9)
    with pytest.raises(
        ConfigError,
        match=r"^data.generator is now a part of its own, named by its name \(write generator: \{name: copy\}; "
        r"--set data.generator.name=copy\)$",
    ):
        RunConfig.from_sections({"data": {"generator": "copy", "n_train": 5}})
    with pytest.raises(ConfigError, match=r"^--set 'data.split=length': data.split is now data.generator.split"):
        RunConfig.from_file("configs/scan.yaml", ["data.split=length"])
    with pytest.raises(ConfigError, match=r"^data.src_lang is now data.pairs.src_lang, in a part of its own"):
        RunConfig.from_sections({"data": {"format": "parallel", "src_lang": "de"}})
    assert RunConfig.from_file("configs/scan.yaml", ["data.generator.split=length"]).data.generator.split == "length"
    with pytest.raises(ConfigError, match=r"generator.split is one of SCAN's splits: it needs name 'scan'"):
        task_config({"generator": {"name": "copy", "split": "length"}})
    with pytest.raises(ConfigError, match=r"generator.max_len \(2\) must be >= generator.min_len \(3\)"):
        task_config({"generator": {"max_len": 2}})
    with pytest.raises(ConfigError, match=r"format 'parallel' needs pairs.src_lang and pairs.tgt_lang"):
        task_config({"task": "masked_translation", "format": "parallel"})


def test_the_fractions_and_rows_of_the_splits_are_the_splits_part_each_task_reading_its_own():
    """valid_fraction and test_fraction (the language models', node classification's, forecasting's),
    node classification's seed, forecasting's train_rows / valid_rows / test_rows and classification's
    and masked LM's n_valid are data.splits' (tasks/parts.py: Splits); a task refuses a field of the part it does not read, and an old run's
    flat fields move into the part only where the task reads them (release 0.1's n_valid of a
    language model is dropped, as before)."""
    from attnlab.runs.migration import migrated_data
    from attnlab.tasks import task_config
    from attnlab.tasks.parts import Splits

    old_node = {"task": "node_classification", "builtin": "karate", "valid_fraction": 0.3, "seed": 4}
    assert task_config(migrated_data(old_node)).splits == Splits(seed=4, valid_fraction=0.3, test_fraction=0.2)
    old_series = {"task": "forecasting", "path": "s.csv", "train_rows": 10, "valid_rows": 5, "test_rows": 5}
    series = task_config(migrated_data(old_series))
    assert series.rows == (10, 5, 5) and series.splits.valid_fraction == 0.1  # the fractions' defaults stay
    old_lm = {"format": "text", "train": "t.txt", "valid_fraction": 0.05}
    assert task_config(migrated_data(old_lm)).splits == Splits(valid_fraction=0.05)
    assert task_config(migrated_data(RELEASE_0_1_DATA)).splits == Splits(valid_fraction=0.1)
    for task in ("classification", "masked_lm"):  # the last n_valid lines held out: splits.n_valid
        assert task_config(migrated_data({"task": task, "train": "t", "n_valid": 8})).splits == Splits(n_valid=8)
        assert task_config({"task": task}).splits == Splits(n_valid=500)
    with pytest.raises(ConfigError, match=r"^splits.n_valid: data.task 'language_model' does not read it"):
        task_config({"format": "text", "splits": {"n_valid": 5}})
    with pytest.raises(ConfigError, match=r"splits.seed: data.task 'forecasting' does not read it"):
        task_config({"task": "forecasting", "splits": {"seed": 5}})
    with pytest.raises(ConfigError, match=r"data.valid_fraction is a field of data.splits: write it inside splits"):
        task_config({"format": "text", "valid_fraction": 0.2})


@dataclasses.dataclass(frozen=True)
class Chosen(TypedConfig):
    mode: Literal["exact", "fast"] = "exact"
    size: int = 4


def test_a_literal_field_takes_one_of_its_values_and_a_part_without_a_section_checks_its_types():
    assert Chosen(mode="fast").mode == "fast"
    with pytest.raises(ConfigError, match=r"^mode must be one of 'exact', 'fast' \(got 'slow'\)$"):
        Chosen(mode="slow")
    with pytest.raises(ConfigError, match=r"^size must be an integer \(got '4'\)$"):
        Chosen(size="4")
