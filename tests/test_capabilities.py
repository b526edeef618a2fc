"""Capabilities are checked when a family or task registers (models/family.py): what a model reads
is one of ``Inputs``, the flags are booleans, and a task can only need capabilities that exist."""

from __future__ import annotations

import pytest

from attnlab.models import FAMILIES, Capabilities, Inputs
from attnlab.tasks import TASKS


def test_every_registered_family_and_task_speaks_in_known_capabilities():
    assert {f.capabilities.inputs for f in FAMILIES.values()} <= set(Inputs)
    assert all(isinstance(t.needs.get("inputs", Inputs.TOKENS), Inputs) for t in TASKS.values())
    assert Capabilities(True, False, False, True, inputs="images").inputs is Inputs.IMAGES
    assert f"{Inputs.IMAGES}" == "images"  # messages name the value


@pytest.mark.parametrize("make, message", [
    (lambda: Capabilities(True, False, False, True, inputs="image_patches"), "inputs must be one of tokens, "),
    (lambda: Capabilities(True, "no", False, True), "capability decoder must be True or False"),
    (lambda: Capabilities.check_needs({"encoders": True}), "unknown capability 'encoders'"),
    (lambda: Capabilities.check_needs({"decoder": 1}), "decoder to be True or False"),
    (lambda: Capabilities.check_needs({"inputs": "pixels"}), "inputs must be one of"),
])
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
        "class ToyFamily(LastValueFamily):\n    name = 'toy_last_value'\n    config = ToyConfig\n")
    (package / "tasks" / "toy_forecasting.py").write_text(
        "from dataclasses import dataclass\n"
        "from attnlab.tasks.forecasting import Forecasting, ForecastingConfig\n"
        "from attnlab.tasks.task import register_task\n\n"
        "@dataclass(frozen=True)\n"
        "class ToyConfig(ForecastingConfig):\n    pass\n\n"
        "@register_task\n"
        "class ToyForecasting(Forecasting):\n    name = 'toy_forecasting'\n    config = ToyConfig\n")
    code = ("import attnlab.models, attnlab.tasks; "
            "print(list(attnlab.models.FAMILIES)[-1], 'toy_forecasting' in attnlab.tasks.TASKS)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["toy_last_value", "True"]


def test_a_family_restricts_its_attention_backends_one_way():
    """A family with an attention stack says which backends fit it by one predicate
    (``backends_fit``) and why others do not (``backends_refusal``); the check and its message come
    from AttentionStack.check_backend, the same for every family."""
    from attnlab.models.stack import AttentionStack
    from attnlab.nn.registry import ATTENTION_BACKENDS

    stacks = {name: f.config for name, f in FAMILIES.items() if issubclass(f.config, AttentionStack)}
    fitting = {name: [b for b, backend in ATTENTION_BACKENDS.items() if config.backends_fit(backend)]
               for name, config in stacks.items()}
    assert fitting["encoder_decoder"] == fitting["decoder_lm"] == list(ATTENTION_BACKENDS)
    for name in ("vit", "captioner", "dual_encoder", "single_stream", "patchtst", "graph", "transformer_xl"):
        assert fitting[name] == ["math", "sdpa", "auto"], name
        assert stacks[name].backends_refusal
    assert not any("_BACKENDS" in name for config in stacks.values() for name in vars(config))


def test_the_two_image_and_text_tasks_fit_only_their_own_family():
    """Both read an image and a text (Inputs.IMAGE_TEXT); the contrastive task needs two towers and
    no joint encoder, visual question answering one encoder over both."""
    fits = {(task, family): TASKS[task].fits(FAMILIES[family].capabilities)
            for task in ("contrastive", "visual_qa") for family in ("dual_encoder", "single_stream")}
    assert fits == {("contrastive", "dual_encoder"): True, ("contrastive", "single_stream"): False,
                    ("visual_qa", "dual_encoder"): False, ("visual_qa", "single_stream"): True}
