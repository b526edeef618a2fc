"""Behaviour unchanged: today's figures against those recorded before the refactoring of issue 16
(tests/golden.py says what they are and how they were recorded).

Training losses are compared to a relative 2e-3: the number of threads and the CPU's instruction
set change the last bits of a matrix product, and 20 Adam steps carry them on (the recurrence of
rnn_luong's input feeding most: 4.2e-4 between OMP_NUM_THREADS=1 and 2 threads on the recording
machine), while a change of behaviour (initialisation, data order, a dropout draw, a loss term,
the schedule) moves the losses of the later steps by far more.
``ATTNLAB_GOLDEN_EXACT=1`` asks for bit-for-bit equality, as on the machine that recorded them.
Decoded outputs and parameter counts are compared exactly.
"""

from __future__ import annotations

import json
import math
import os

import pytest

import golden

RECORDED = json.loads(golden.FIGURES.read_text())
RTOL = 0.0 if os.environ.get("ATTNLAB_GOLDEN_EXACT") == "1" else 2e-3


@pytest.fixture(scope="module")
def data_overrides(tmp_path_factory):
    return golden.synthetic_data(tmp_path_factory.mktemp("golden") / "data")


def test_every_training_preset_is_recorded():
    assert sorted(RECORDED["preset_losses"]) == [p.name for p in golden.training_presets()]


@pytest.mark.parametrize("preset", golden.training_presets(), ids=lambda p: p.stem)
def test_first_training_losses_of_each_preset_are_unchanged(preset, data_overrides, tmp_path):
    losses = golden.train_losses(preset, data_overrides, tmp_path / "run")
    recorded = RECORDED["preset_losses"][preset.name]
    assert len(losses) == len(recorded) == golden.STEPS
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, recorded))
    assert all(math.isclose(a, b, rel_tol=RTOL, abs_tol=0.0) for a, b in zip(losses, recorded)), (
        f"{preset.name}: worst relative difference {worst:.3g} (tolerance {RTOL:g})\nnow      {losses}\n"
        f"recorded {recorded}")


def test_greedy_and_beam_outputs_of_a_run_written_before_the_refactoring_are_unchanged():
    assert golden.decodes() == RECORDED["decodes"]


def test_info_of_the_papers_base_and_big_models_is_unchanged():
    assert golden.info() == RECORDED["info"]
