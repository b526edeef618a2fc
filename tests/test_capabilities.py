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
