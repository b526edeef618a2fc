"""Configs compose, they do not inherit fields (issue 61): the config classes counted.

A config class is any class a config file's section is parsed into: every registered family's
config (model), every registered task's config (data), TrainConfig (train), and the parts composed
inside them (a family's ``stack``, ``backends`` and its parts, ...). A field is declared by the class
whose own body annotates it, a mixin's or a base's included. A field that holds a composed part
(``stack: StackConfig``) names the part, whose own fields are the declarations: it is not counted,
or every family composing a stack would repeat 'stack'.

Where the code stands (`python tests/test_config_classes.py` prints it): the field names still
declared in more than one class are listed in REPEATED, each with the classes that declare it, so
that a new repeat fails here and each one composed away must be taken off the list.
"""

from __future__ import annotations

import dataclasses
import typing
from collections import defaultdict

import pytest

from attnlab.config import TypedConfig
from attnlab.models import FAMILIES
from attnlab.runs.train_config import TrainConfig
from attnlab.tasks.task import TASKS, TaskConfig


def section_classes() -> list[type]:
    """The classes that whole sections are parsed into."""
    return sorted(
        {*(f.config for f in FAMILIES.values()), *(t.config for t in TASKS.values()), TrainConfig},
        key=lambda c: (c.__module__, c.__name__),
    )


def config_classes() -> list[type]:
    """The section classes and every config part composed inside them, recursively."""
    found: list[type] = []
    todo = section_classes()
    while todo:
        cls = todo.pop()
        if cls in found:
            continue
        found.append(cls)
        hints = typing.get_type_hints(cls)
        todo += [
            hints[f.name]
            for f in dataclasses.fields(cls)
            if isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name])
        ]
    return sorted(found, key=lambda c: (c.__module__, c.__name__))


def declarations() -> dict[str, set[str]]:
    """Field name -> the classes (config classes and the mixins and bases they inherit) declaring it."""
    declared: dict[str, set[str]] = defaultdict(set)
    for cls in config_classes():
        hints = typing.get_type_hints(cls)
        fields = {f.name for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(hints[f.name])}
        for klass in cls.__mro__:
            for name in klass.__dict__.get("__annotations__", {}):
                if name in fields:
                    declared[name].add(klass.__qualname__)
    return declared


def repeated() -> dict[str, set[str]]:
    return {name: classes for name, classes in declarations().items() if len(classes) > 1}


def inheritance_depth(cls: type) -> int:
    """The longest chain of classes from ``cls`` up to, not counting, object (DecoderLMConfig ->
    FamilyConfig -> TypedConfig: 3)."""
    return 1 + max((inheritance_depth(base) for base in cls.__bases__ if base is not object), default=0)


def bases_with_fields(cls: type) -> int:
    """The classes above ``cls`` in its MRO that declare fields of it (a mixin or base with fields is a level)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    return sum(1 for klass in cls.__mro__[1:] if fields & set(klass.__dict__.get("__annotations__", {})))


# The names still declared in several config classes after the backends' options (nn/backends/:
# BackendOptions), the patches (models/vit.py: Patches) and the two sides' depths (models/family.py:
# Depths) were composed and the data's sizes left the model sections for the DataShape
# (models/shape.py: vocab_size, pad_id, image and series sizes, n_classes), and the Transformer
# families' positions became one part (models/transformer_config.py: Positions), and the
# data sections' scenes, splits (the fractions and forecasting's rows too), images, text, and translation's
# generator and pairs became parts (tasks/scene_splits.py: Scenes; tasks/parts.py: Splits, ImageSource, Text;
# tasks/pairs_section.py: PairGenerator, Pairs), and no task config inherits another (what the ex-subclasses
# still declared beside their base, max_caption_len, block_size, translation's splits, became parts), and
# the split files became one part, Files, that each task's section composes flattened (config.flattened):
# written data.train, data.valid, data.test as before, which tests/golden.py (kept byte for byte) sets; the
# format (data.format, which golden.py reads) with them; translation's seed, n_train, n_valid and n_test are
# its Splits part flattened the same way (golden.py sets data.n_valid); and a running text's block_size is
# its Windows part (tasks/language_model.py), a captioned section's max_caption_len its Captions part
# (tasks/captions_section.py), and classification's, masked_lm's and encoder's max_len (the longest text
# input kept) their Truncation part (tasks/parts.py: >= 3; classification checks its own >= 4 beside it),
# each flattened the same way, so data.block_size, data.max_caption_len and data.max_len are written as
# before; and the recurrent and convolutional families' d_model, n_layers and dropout (cnn: d_model and
# dropout) are a StackConfig's and their max_len a Positions' (convs2s's learnt positions; rnn's, scheme
# none, the positions of its location score), each composed flattened the same way: written model.d_model,
# ..., model.max_len as before, the stack's and the positions' other fields hidden at their defaults, and
# no attention stack for all that (models/stack.py: stack_of). Left, each one name for different
# quantities: max_len, the longest text input a data section keeps (Truncation), the lengths a pair
# generator draws (PairGenerator, with its min_len) and the longest sequence a model is built for
# (Positions); seed, the draw of a data set's splits (Splits) and the training's (TrainConfig), kept apart
# so that every training seed sees the same splits; d_embed, ConvS2S's embedding width and the dual
# encoder's joint space.
REPEATED = {
    "max_len": {"PairGenerator", "Positions", "Truncation"},
    "seed": {"Splits", "TrainConfig"},
    "d_embed": {"ConvS2SConfig", "DualEncoderConfig"},
}


def test_the_backends_options_are_composed_parts_with_names_of_their_own():
    classes = {c.__name__: c for c in config_classes()}
    assert {"BackendOptions", "ChunkedOptions", "PatternOptions", "LinearOptions", "StackConfig"} <= set(classes)
    declared = declarations()
    for part in ("BackendOptions", "ChunkedOptions", "PatternOptions", "LinearOptions"):
        for f in dataclasses.fields(classes[part]):
            composed = dataclasses.is_dataclass(typing.get_type_hints(classes[part])[f.name])
            assert declared.get(f.name, set()) == (set() if composed else {part}), (f.name, declared.get(f.name))
    assert declared["encoder"] == declared["decoder"] == {"Depths"} and "n_encoder_layers" not in declared
    assert declared["size"] == {"Patches"} and "patch_size" not in declared and "patch_positional" not in declared
    transformer = {f.name for f in dataclasses.fields(FAMILIES["decoder_lm"].config)}
    assert "backends" in transformer and not transformer & {
        "attention_window",
        "attention_block",
        "sparse_stride",
        "linear_features",
        "attention_key_block",
    }


def test_no_family_config_declares_a_size_that_the_data_decides():
    """vocab_size, pad_id, the image's and the series' sizes, n_classes, ... are the DataShape's
    (models/shape.py), handed to the builder: no model section has them, at any depth."""
    from attnlab.config import field_paths
    from attnlab.models.shape import SIZES

    for family in FAMILIES.values():
        assert not SIZES & {path.rpartition(".")[2] for path in field_paths(family.config)}, family.name


def test_no_field_name_is_declared_in_two_config_classes_beyond_the_listed_ones():
    found = repeated()
    for name, classes in REPEATED.items():
        assert found.get(name, set()) == classes, f"{name}: now declared by {found.get(name)}; update REPEATED"
    new = {name: classes for name, classes in found.items() if name not in REPEATED}
    assert not new, f"field names declared in several config classes: {new}"


def test_every_section_class_is_a_typed_config():
    assert all(issubclass(cls, TypedConfig) for cls in section_classes())
    # DecoderLMConfig -> FamilyConfig -> TypedConfig: two fieldless levels above a family's config, no
    # Transformer base between it and FamilyConfig (5 before its parts were composed, 4 before the
    # registry's key moved into TypedConfig); the deepest section class was a task's
    # (ContrastiveConfig -> CaptioningConfig -> TaskConfig -> ...: 5) until the task configs composed
    # their parts: now none is deeper than a family's, and a part is at most 2 (X -> TypedConfig)
    assert inheritance_depth(FAMILIES["decoder_lm"].config) == 3
    assert max(inheritance_depth(family.config) for family in FAMILIES.values()) == 3
    # but one: masked translation's section is translation's, field for field, under another task's
    # name (a section class names the one task it describes): a subclass that declares no field
    renamed = TASKS["masked_translation"].config
    assert renamed.__bases__ == (TASKS["translation"].config,) and "__annotations__" not in vars(renamed)
    others = [cls for cls in config_classes() if cls is not renamed]
    assert max(inheritance_depth(cls) for cls in others) == 3 and inheritance_depth(renamed) == 4
    assert all(inheritance_depth(cls) <= 2 for cls in config_classes() if cls not in section_classes())
    assert max(bases_with_fields(cls) for cls in others) == 0


def test_the_task_configs_that_inherited_another_compose_its_parts():
    """ImageEncoderConfig inherited ImageClassificationConfig, ContrastiveConfig CaptioningConfig,
    SegmentLanguageModelConfig LanguageModelConfig (5 deep, ContrastiveConfig too), and captioning's and visual_qa's the SceneSplits
    mixin: each now has one base, TaskConfig, which declares no field, and composes what it shared
    as parts (images; images, scenes, splits, text; text; generator, pairs, text), the parts' fields
    declared once, by the part; what was left of the shared section became parts too, written flat
    (the files: Files; block_size: Windows; max_caption_len: Captions), or each declares it, listed in
    REPEATED."""
    for name in (
        "image_encoder",
        "image_classification",
        "captioning",
        "contrastive",
        "visual_qa",
        "segment_language_model",
    ):
        config = TASKS[name].config
        assert config.__bases__ == (TaskConfig,) and bases_with_fields(config) == 0, name
        assert inheritance_depth(config) == 3, name  # -> TaskConfig -> TypedConfig, as a family
    declared = declarations()
    for part, fields in {
        "ImageSource": ("dataset", "colour", "resize"),
        "Text": ("tokenizer", "vocab_size"),
        "Scenes": ("held_out", "image_size", "noise", "max_objects"),
        "Pairs": ("src_lang", "tgt_lang", "max_src_len", "max_tgt_len", "shared_vocab"),
        "PairGenerator": ("name", "min_len", "test_min_len", "test_max_len", "split"),
    }.items():
        assert all(declared[field] == {part} for field in fields), part
    assert [f.name for f in dataclasses.fields(TASKS["image_encoder"].config)] == ["images"]
    shared = {"images", "scenes", "splits", "text", "files", "captions"}
    assert [f.name for f in dataclasses.fields(TASKS["contrastive"].config)] == [
        *[f.name for f in dataclasses.fields(TASKS["captioning"].config) if f.name in shared],
        "labels",
        "prompts",
    ]
    assert [f.name for f in dataclasses.fields(TASKS["masked_translation"].config)] == [
        f.name for f in dataclasses.fields(TASKS["translation"].config)
    ]
    assert [f.name for f in dataclasses.fields(TASKS["segment_language_model"].config)] == [
        *[f.name for f in dataclasses.fields(TASKS["language_model"].config)],
        "context_segments",
    ]


def test_no_model_config_mixes_in_a_class_beside_its_base():
    """The mixins with fields (PatchGrid, TwoSidedSizes, AttentionStack) became parts: what they
    checked and derived is the part's own (Patches.grid, Depths.encoder_layers, StackConfig.check_backend)
    or the family's (ModelFamily.backends_fit); and the Transformer families' TransformerConfig, the
    last base with fields, became the parts each of their configs declares (stack, positions,
    embeddings, backends), a Protocol of what they offer (models/transformer_config.py:
    TransformerConfig) and the checks across them on the family (TransformerFamily.check_config): each
    model config has one base, and no base of it declares a field."""
    for family in FAMILIES.values():
        for cls in family.config.__mro__:
            assert len([base for base in cls.__bases__ if base is not object]) <= 1, (family.name, cls.__name__)
    assert {name: bases_with_fields(family.config) for name, family in FAMILIES.items()} == {
        name: 0 for name in FAMILIES
    }


if __name__ == "__main__":
    classes = config_classes()
    print(f"{len(section_classes())} section classes, {len(classes)} config classes in all")
    print(
        f"deepest inheritance: {max(inheritance_depth(c) for c in classes)} "
        f"({max(classes, key=inheritance_depth).__name__}); most bases with fields: "
        f"{max(bases_with_fields(c) for c in classes)}"
    )
    found = repeated()
    print(f"{len(found)} field names declared in more than one config class:")
    for name, where in sorted(found.items(), key=lambda item: -len(item[1])):
        print(f"  {name}: {len(where)} ({', '.join(sorted(where))})")


def test_the_split_files_are_one_part_written_flat_in_each_section():
    """The files (train, valid, test) are declared once, by Files, which eight tasks compose with
    config.flattened: a section writes them beside its own fields, as every config and run has."""
    from attnlab.errors import ConfigError
    from attnlab.tasks import task_config
    from attnlab.tasks.parts import Files

    declared = declarations()
    assert declared["train"] == declared["valid"] == declared["test"] == declared["format"] == {"Files"}
    holders = {n for n, t in TASKS.items() if "files" in {f.name for f in dataclasses.fields(t.config)}}
    assert len(holders) == 9  # the eight tasks that read files, and masked translation's (translation's)
    section = {"task": "classification", "train": "a.tsv", "test": "c.tsv", "header": True}
    cls = task_config(section)
    assert cls.files == Files(train="a.tsv", test="c.tsv") and cls.header is True
    written = cls.to_dict()
    assert (written["train"], written["valid"], written["test"]) == ("a.tsv", None, "c.tsv")
    assert "files" not in written and task_config(written) == cls
    lm = task_config({"task": "language_model", "train": "t.txt"})
    assert "test" not in lm.to_dict() and lm.field_names()[:3] == ["format", "train", "valid"]
    assert "format" not in written and lm.files.format == "text"  # classification reads one format: none named
    with pytest.raises(ConfigError, match=r"^data.task 'language_model' has no field 'test'"):
        task_config({"task": "language_model", "train": "t.txt", "test": "u.txt"})
    with pytest.raises(ConfigError, match=r"^data.task 'classification' has no field 'files'"):
        task_config({"task": "classification", "files": {"train": "a.tsv"}})


def test_translations_splits_are_written_flat_and_their_errors_name_them_so():
    from attnlab.errors import ConfigError
    from attnlab.tasks import task_config
    from attnlab.tasks.parts import Splits

    declared = declarations()
    assert declared["n_valid"] == declared["n_train"] == declared["n_test"] == {"Splits"}
    cfg = task_config({"task": "translation", "format": "scan", "train": "t.txt", "n_valid": 40})
    assert cfg.splits == Splits(seed=1234, n_valid=40, n_test=1000)  # the task's defaults, n_valid given
    written = cfg.to_dict()
    assert (written["seed"], written["n_train"], written["n_valid"], written["n_test"]) == (1234, None, 40, 1000)
    assert "splits" not in written and "valid_fraction" not in written and task_config(written) == cfg
    with pytest.raises(ConfigError, match=r"^n_valid must be >= 1 \(got 0\)$"):
        task_config({"task": "translation", "format": "scan", "train": "t.txt", "n_valid": 0})
    with pytest.raises(ConfigError, match=r"^n_test must be given \(got null\)$"):
        task_config({"task": "translation", "format": "scan", "train": "t.txt", "n_test": None})
    with pytest.raises(ConfigError, match=r"^data.task 'translation' has no field 'valid_fraction'"):
        task_config({"task": "translation", "valid_fraction": 0.1})


@pytest.mark.parametrize(
    "part, field, tasks",
    [
        ("Windows", "block_size", {"language_model": 64, "segment_language_model": 64}),
        ("Captions", "max_caption_len", {"captioning": 32, "contrastive": 32}),
        ("Truncation", "max_len", {"classification": 128, "encoder": 512, "masked_lm": 128}),
    ],
)
def test_a_field_that_tasks_shared_is_one_part_written_flat_in_each_section(tmp_path, part, field, tasks):
    """block_size (Windows), max_caption_len (Captions), a text input's max_len (Truncation): each
    declared once among the data sections, by the part, which each task composes with config.flattened
    and its own default: the section writes the field beside its own, as every config and run has, and
    refuses a bad value in one line naming it as written."""
    from attnlab.errors import ConfigError
    from attnlab.runs.config import RunConfig
    from attnlab.tasks import task_config

    declared = declarations()[field]  # max_len: the model sections' and the generator's too (REPEATED)
    assert part in declared and not declared & {t.config.__qualname__ for t in TASKS.values()}
    assert declared == {part} or field == "max_len"
    for task, default in tasks.items():
        holder = next(f.name for f in dataclasses.fields(TASKS[task].config) if f.type == part)
        cfg = task_config({"task": task})
        assert getattr(getattr(cfg, holder), field) == default and type(getattr(cfg, holder)).__name__ == part
        written = cfg.to_dict()
        assert written[field] == default and holder not in written and task_config(written) == cfg
        assert task_config({**written, field: 7}) == dataclasses.replace(cfg, **{holder: {field: 7}})
        with pytest.raises(ConfigError, match=rf"^data.task '{task}' has no field '{holder}'"):
            task_config({"task": task, holder: {field: 7}})
        config = tmp_path / f"{task}.yaml"
        config.write_text(f"data: {{task: {task}, {field}: 0}}\n")
        with pytest.raises(ConfigError, match=rf"^{config}: {field} must be >= \d+ \(got 0\)$"):
            RunConfig.from_file(config)


# The model sections of the recurrent and convolutional families with their defaults, as they were
# written before their width, depth, dropout and max_len were composed (issue 61; captured at 6d189f6):
# every written config and run directory has these keys, flat in the section.
WRITTEN_BEFORE = {
    "rnn": {
        "arch": "rnn",
        "d_model": 512,
        "n_layers": 6,
        "depths": {"encoder": None, "decoder": None},
        "dropout": 0.1,
        "embedding_dropout": None,
        "max_len": 1024,
        "tie_embeddings": "all",
        "rnn_cell": "gru",
        "rnn_attention": "bahdanau",
        "score": "additive",
        "bidirectional": True,
        "input_feeding": True,
        "teacher_forcing": 1.0,
        "rnn_decoder": "deep_output",
    },
    "convs2s": {
        "arch": "convs2s",
        "d_embed": 512,
        "d_model": 512,
        "n_layers": 6,
        "depths": {"encoder": None, "decoder": None},
        "kernel_width": 3,
        "dropout": 0.1,
        "max_len": 1024,
    },
    "cnn": {"arch": "cnn", "d_model": 32, "dropout": 0.1},
}


@pytest.mark.parametrize("arch", sorted(WRITTEN_BEFORE))
def test_the_recurrent_and_convolutional_sections_are_written_and_read_as_before(arch):
    """Their d_model, n_layers, dropout and max_len are written in the section itself, parse from it,
    and a wrong value is named as the section writes it."""
    from attnlab.errors import ConfigError
    from attnlab.models import model_config

    cfg = model_config(arch=arch)
    assert cfg.to_dict() == WRITTEN_BEFORE[arch] and model_config(WRITTEN_BEFORE[arch]) == cfg
    given = {
        k: v for k, v in {"d_model": 24, "n_layers": 2, "dropout": 0.3, "max_len": 50}.items() if k in cfg.to_dict()
    }
    written = model_config({"arch": arch, **given}).to_dict()
    assert written == {**WRITTEN_BEFORE[arch], **given} and model_config(written).to_dict() == written
    for field, value, message in (
        ("d_model", 0, r"d_model must be >= 1 \(got 0\)"),
        ("d_model", "x", r"d_model must be an integer \(got 'x'\)"),
        ("n_layers", 0, r"n_layers must be >= 1 \(got 0\)"),
        ("dropout", 1.5, r"dropout must be in \[0, 1\) \(got 1.5\)"),
        ("max_len", 0, r"max_len must be >= 1 \(got 0\)"),
        ("max_len", "x", r"max_len must be an integer \(got 'x'\)"),
    ):
        if field in cfg.to_dict():
            with pytest.raises(ConfigError, match=rf"^{message}$"):
                model_config({"arch": arch, field: value})
    for hidden in ("n_heads", "d_ff", "stack", "positions", "scheme"):  # a Transformer's, not these families'
        with pytest.raises(ConfigError, match=rf"^model.arch '{arch}' has no field '{hidden}'; its fields: [^\n]*$"):
            model_config({"arch": arch, hidden: 4})


DATA_OF = {  # a task each of these families fits, whose section reads no file
    "rnn": {"task": "translation", "format": "scan", "train": "t.txt"},
    "convs2s": {"task": "translation", "format": "scan", "train": "t.txt"},
    "cnn": {"task": "image_classification", "images": {"dataset": "digits"}},
}


@pytest.mark.parametrize("arch", sorted(WRITTEN_BEFORE))
def test_the_recurrent_and_convolutional_families_have_no_attention_stack(arch):
    """Whatever part holds their width, depth and dropout, nothing takes them for a family with an
    attention stack: no stack (models: stack_of), noam refused (it needs one's d_model), tensor
    parallelism refused (no heads to split), `attnlab info`'s line their hidden size, not heads."""
    from attnlab.cli.info import _describe_model
    from attnlab.errors import ConfigError
    from attnlab.models import model_config, stack_of
    from attnlab.models.shape import DataShape
    from attnlab.parallel.tensor_parallel import check_tensor_parallel
    from attnlab.runs.config import RunConfig

    cfg = model_config(arch=arch)
    assert stack_of(cfg) is None
    assert cfg.max_positions == (1024 if arch == "convs2s" else None)  # convs2s's learnt positions
    assert cfg.longest_sequence == (None if arch == "cnn" else 1024)
    sections = {"model": {"arch": arch}, "data": DATA_OF[arch]}
    assert RunConfig.from_sections({**sections, "train": {"lr_schedule": "cosine"}}).model == cfg
    with pytest.raises(ConfigError, match=rf"^train.lr_schedule 'noam' .* which arch '{arch}' does not have; "):
        RunConfig.from_sections({**sections, "train": {"lr_schedule": "noam"}})
    with pytest.raises(ConfigError, match=rf"feed-forward widths; model.arch '{arch}' has none$"):
        check_tensor_parallel(cfg, 2)
    shape = DataShape(vocab_size=100, channels=3, n_classes=10, image_height=8, image_width=8)
    assert (
        _describe_model(cfg, shape, "100")
        == {
            "rnn": "rnn, hidden size 512, 6+6 layers, vocab 100",
            "convs2s": "convs2s, hidden size 512, 6+6 layers, vocab 100",
            "cnn": "cnn, hidden size 32, vocab 100",
        }[arch]
    )


def test_the_recurrent_and_convolutional_families_compose_their_width_depth_dropout_and_max_len():
    """d_model, n_layers and dropout are declared by StackConfig alone, max_len by no model section:
    rnn and convs2s hold a StackConfig flattened with those three and a Positions with max_len, cnn a
    StackConfig with d_model and dropout; the parts' other fields keep defaults that no width refuses
    (one head), and only the stack's dropout changed its place in the section (beside its d_model)."""
    from attnlab.models import StackConfig, model_config
    from attnlab.models.transformer_config import Positions

    declared = declarations()
    assert declared["d_model"] == declared["n_layers"] == declared["dropout"] == {"StackConfig"}
    assert not {"RNNConfig", "ConvS2SConfig", "CNNConfig"} & declared["max_len"]
    sizes = {"d_model": 7, "n_layers": 2, "dropout": 0.3, "max_len": 50}
    rnn = model_config(arch="rnn", **sizes)
    assert rnn.stack == StackConfig(d_model=7, n_heads=1, n_layers=2, dropout=0.3)
    assert rnn.positions == Positions(scheme="none", max_len=50) and rnn.max_positions is None
    convs2s = model_config(arch="convs2s", **sizes)
    assert convs2s.stack == rnn.stack and convs2s.positions == Positions(scheme="learned", max_len=50)
    assert convs2s.max_positions == convs2s.longest_sequence == 50
    cnn = model_config(arch="cnn", d_model=7, dropout=0.3)
    assert cnn.stack == StackConfig(d_model=7, n_heads=1, dropout=0.3) and not hasattr(cnn, "positions")
    for arch, cfg in (("rnn", rnn), ("convs2s", convs2s), ("cnn", cnn)):
        written = list(cfg.to_dict())
        assert not {"stack", "positions"} & {*written, *cfg.field_names()}
        assert [k for k in written if k != "dropout"] == [k for k in WRITTEN_BEFORE[arch] if k != "dropout"]
        assert written[written.index("d_model") + (2 if "n_layers" in written else 1)] == "dropout"
