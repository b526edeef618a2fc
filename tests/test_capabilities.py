"""Capabilities are checked when a family or task registers (models/family.py): what a model reads
is a registered kind of input (``INPUT_KINDS``), the flags are booleans, and a task can only need capabilities that exist."""

from __future__ import annotations

import pytest

from attnlab.models import FAMILIES, INPUT_KINDS, Capabilities, InputKind, Inputs
from attnlab.tasks import TASKS


def test_every_registered_family_and_task_speaks_in_known_capabilities():
    kinds = set(INPUT_KINDS.values())
    assert {f.capabilities.inputs for f in FAMILIES.values()} <= kinds
    assert all(t.needs.get("inputs", Inputs.TOKENS) in kinds for t in TASKS.values())
    assert all(isinstance(kind, InputKind) and INPUT_KINDS[kind] is kind for kind in kinds)
    assert Capabilities(True, False, False, True, inputs="images").inputs is Inputs.IMAGES
    assert f"{Inputs.IMAGES}" == "images"  # messages name the value


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Capabilities(True, False, False, True, inputs="image_patches"), "inputs must be one of tokens, "),
        (lambda: Capabilities(True, "no", False, True), "capability decoder must be True or False"),
        (lambda: Capabilities.check_needs({"encoders": True}), "unknown capability 'encoders'"),
        (lambda: Capabilities.check_needs({"decoder": 1}), "decoder to be True or False"),
        (lambda: Capabilities.check_needs({"inputs": "pixels"}), "inputs must be one of"),
    ],
)
def test_a_mistaken_capability_is_refused_when_it_is_declared(make, message):
    with pytest.raises(TypeError, match=message):
        make()


def test_a_task_that_needs_images_fits_only_the_families_that_read_them():
    image_task = TASKS["image_classification"]
    assert image_task.needs["inputs"] is Inputs.IMAGES
    fitting = sorted(name for name, family in FAMILIES.items() if image_task.fits(family.capabilities))
    assert fitting == sorted(name for name, family in FAMILIES.items() if family.capabilities.inputs == "images")
    assert "vit" in fitting and "encoder_decoder" not in fitting


def test_a_new_module_in_the_package_registers_its_family_and_task_with_no_other_edit(tmp_path):
    """models/ and tasks/ import every module of their folder (as nn/backends/ does): a copy of the
    package with one new file in each has the new family and task, and nothing else was edited."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import attnlab

    package = tmp_path / "attnlab"
    shutil.copytree(Path(attnlab.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "models" / "toy_last_value.py").write_text(
        "from dataclasses import dataclass\n"
        "from attnlab.models.family import register_family\n"
        "from attnlab.models.last_value import LastValueConfig, LastValueFamily\n\n"
        "@dataclass(frozen=True)\n"
        "class ToyConfig(LastValueConfig):\n    pass\n\n"
        "@register_family\n"
        "class ToyFamily(LastValueFamily):\n    name = 'toy_last_value'\n    config = ToyConfig\n"
    )
    (package / "tasks" / "toy_forecasting.py").write_text(
        "from dataclasses import dataclass\n"
        "from attnlab.tasks.forecasting import Forecasting, ForecastingConfig\n"
        "from attnlab.tasks.task import register_task\n\n"
        "@dataclass(frozen=True)\n"
        "class ToyConfig(ForecastingConfig):\n    pass\n\n"
        "@register_task\n"
        "class ToyForecasting(Forecasting):\n    name = 'toy_forecasting'\n    config = ToyConfig\n"
    )
    code = (
        "import attnlab.models, attnlab.tasks; "
        "print('toy_last_value' in attnlab.models.FAMILIES, 'toy_forecasting' in attnlab.tasks.TASKS)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


def test_a_family_restricts_its_attention_backends_one_way():
    """A family with an attention stack says which backends fit it by one predicate
    (``backends_fit``, on the family) and why others do not (``backends_refusal``); the check and its
    message come from StackConfig.check_backend, the same for every family."""
    from attnlab.errors import ConfigError
    from attnlab.models import model_config
    from attnlab.models.stack import StackConfig
    from attnlab.nn.registry import ATTENTION_BACKENDS

    stacks = {name: f for name, f in FAMILIES.items() if "stack" in f.config.field_names()}
    assert all(isinstance(f.config().stack, StackConfig) for f in stacks.values())
    fitting = {
        name: [b for b, backend in ATTENTION_BACKENDS.items() if family.backends_fit(backend)]
        for name, family in stacks.items()
    }
    assert fitting["encoder_decoder"] == fitting["decoder_lm"] == list(ATTENTION_BACKENDS)
    for name in ("vit", "captioner", "dual_encoder", "single_stream", "patchtst", "graph", "transformer_xl"):
        assert fitting[name] == ["math", "sdpa", "auto"], name
        assert stacks[name].backends_refusal
        with pytest.raises(ConfigError) as refused:
            model_config(arch=name, stack={"attention_backend": "chunked"})
        assert str(refused.value) == (
            f"attention_backend 'chunked' {stacks[name].backends_refusal}; use 'math' or 'sdpa' or 'auto'"
        )
    assert not any("_BACKENDS" in name for family in stacks.values() for name in vars(family.config))


def test_the_two_image_and_text_tasks_fit_only_their_own_family():
    """Both read an image and a text (Inputs.IMAGE_TEXT); the contrastive task needs two towers and
    no joint encoder, visual question answering one encoder over both."""
    fits = {
        (task, family): TASKS[task].fits(FAMILIES[family].capabilities)
        for task in ("contrastive", "visual_qa")
        for family in ("dual_encoder", "single_stream")
    }
    assert fits == {
        ("contrastive", "dual_encoder"): True,
        ("contrastive", "single_stream"): False,
        ("visual_qa", "dual_encoder"): False,
        ("visual_qa", "single_stream"): True,
    }


# -- model interfaces: the protocols of nn/interfaces.py, checked when a family registers -------------


def test_every_built_in_familys_model_has_the_interfaces_its_capabilities_promise():
    from attnlab.nn.interfaces import CausalLM, Classifier, EncodingModel, IncrementalDecoder, Seq2SeqModel, StagedModel

    def kinds(name: str) -> list[str]:
        model = FAMILIES[name].model
        return [
            p.__name__
            for p in (EncodingModel, Seq2SeqModel, CausalLM, IncrementalDecoder, Classifier, StagedModel)
            if issubclass(model, p)
        ]

    assert FAMILIES["encoder_decoder"].model.__name__ == "EncoderDecoder"
    assert kinds("encoder_decoder") == [
        "EncodingModel",
        "Seq2SeqModel",
        "CausalLM",
        "IncrementalDecoder",
        "StagedModel",
    ]  # CausalLM: every module has a forward
    assert kinds("rnn") == ["EncodingModel", "Seq2SeqModel", "CausalLM", "IncrementalDecoder"]
    assert kinds("encoder_only") == ["EncodingModel", "CausalLM", "Classifier", "StagedModel"]
    assert kinds("cnn") == ["CausalLM", "Classifier"]


def _family(name: str, capabilities: Capabilities, model: type, staged: bool = False) -> type:
    from attnlab.models.family import FamilyConfig, ModelFamily, Staging

    config = type(f"{name}Config", (FamilyConfig,), {"__annotations__": {}})
    return type(
        name,
        (ModelFamily,),
        {
            "name": name,
            "config": config,
            "capabilities": capabilities,
            "build": staticmethod(model),
            "staging": Staging(lambda cfg: 1) if staged else None,
        },
    )


def test_a_family_whose_model_lacks_a_promised_interface_is_refused_when_it_registers():
    from torch import nn

    from attnlab.models import register_family

    class OnlyDecode(nn.Module):
        def decode(self, tgt_in, memory, src_valid, cache=None): ...

    class OnlyForward(nn.Module):
        def forward(self, ids): ...

    seq2seq = Capabilities(encoder=True, decoder=True, incremental_decoding=False, attention_weights=False)
    with pytest.raises(
        TypeError,
        match=r"^model family 'toy_seq2seq' declares encoder and decoder, so its model must "
        r"implement Seq2SeqModel \(nn/interfaces.py\); OnlyDecode lacks encode$",
    ):
        register_family(_family("toy_seq2seq", seq2seq, OnlyDecode))
    incremental = Capabilities(encoder=False, decoder=True, incremental_decoding=True, attention_weights=False)
    with pytest.raises(
        TypeError,
        match=r"^model family 'toy_lm' declares incremental_decoding, so its model must "
        r"implement IncrementalDecoder \(nn/interfaces.py\); OnlyForward lacks "
        r"new_cache$",
    ):
        register_family(_family("toy_lm", incremental, OnlyForward))
    plain = Capabilities(encoder=True, decoder=False, incremental_decoding=False, attention_weights=False)
    with pytest.raises(
        TypeError,
        match=r"^model family 'toy_staged' declares staging, so its model must implement "
        r"StagedModel \(nn/interfaces.py\); OnlyForward lacks stages$",
    ):
        register_family(_family("toy_staged", plain, OnlyForward, staged=True))

    def build(cfg):  # no annotation: the model's class is unknown
        return OnlyForward()

    unknown = _family("toy_unknown", plain, OnlyForward)
    unknown.build = staticmethod(build)
    with pytest.raises(
        TypeError,
        match=r"^model family 'toy_unknown': build must be its model's class, or name that "
        r"class as its return annotation$",
    ):
        register_family(unknown)
    assert not {"toy_seq2seq", "toy_lm", "toy_staged", "toy_unknown"} & set(FAMILIES)
