"""Tasks as instances (tasks/task.py, tasks/abilities.py): a task is made from its data section
(``cfg.task``), what only some tasks do is an ability found with ``isinstance``, and no task
behaviour is a class method.
The commands' refusals of a run whose task lacks an ability are in tests/test_plugins.py (a task
from outside the package, with one ability and without another)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from attnlab.decode.spec import Beam, Greedy
from attnlab.errors import AttnlabError, UsageError
from attnlab.tasks import (
    TASKS,
    Analysed,
    ClassificationConfig,
    EvaluatesFiles,
    EvaluatesFileSplits,
    EvaluatesSplits,
    ForecastingConfig,
    Pipelined,
    Predicts,
    Searched,
    VisualQAConfig,
)
from attnlab.tasks.captions_section import CaptioningConfig
from attnlab.tasks.node_classification import NodeClassificationConfig
from attnlab.tasks.scene_splits import Scenes

TASKS_DIR = Path(__file__).resolve().parents[1] / "attnlab" / "tasks"
ABILITIES = (EvaluatesFiles, EvaluatesFileSplits, EvaluatesSplits, Searched, Predicts, Pipelined, Analysed)

# Each built-in task's abilities: what `evaluate --data` / `--split`, evaluate's search, `predict`,
# train.strategy pp and `inspect --split` / `prune` find by isinstance.
EXPECTED = {
    "translation": {"Pipelined", "Analysed"},
    "language_model": {"Pipelined", "Analysed"},
    "classification": {"EvaluatesFiles", "EvaluatesSplits", "Predicts", "Pipelined", "Analysed"},
    "masked_lm": {"Pipelined", "Analysed"},
    "image_classification": {"EvaluatesFiles", "EvaluatesSplits", "Predicts", "Analysed"},
    "captioning": {"EvaluatesFiles", "EvaluatesSplits", "Searched", "Analysed"},
    "contrastive": {"EvaluatesFiles", "EvaluatesSplits", "Predicts"},
    "visual_qa": {"EvaluatesFiles", "EvaluatesSplits", "Analysed"},
    "node_classification": {"EvaluatesFiles", "EvaluatesSplits"},
    "forecasting": {"EvaluatesFiles", "EvaluatesFileSplits", "EvaluatesSplits"},
    "segment_language_model": {"EvaluatesFiles", "EvaluatesSplits", "Analysed"},
    "masked_translation": set(),
    "encoder": set(),
    "image_encoder": {"Analysed"},
    "audio_classification": {"EvaluatesFiles", "EvaluatesSplits", "Predicts"},
}
# The data sections that need a field to be made (every other is made from its defaults).
NO_DEFAULTS = {"node_classification": {"builtin": "karate"}}

# The class methods left in attnlab/tasks/, each read by a registry before there is a data section
# to make a task from: Task.fits (does a family's capabilities meet the task's needs; runs/config.py,
# the error messages listing the families a task fits). The data sections' own (TypedConfig's
# from_dict, field_names: attnlab/config.py) are not in tasks/.
JUSTIFIED_CLASSMETHODS = {("task.py", "Task", "fits")}


def built_in_configs():
    return [(name, task.config(**NO_DEFAULTS.get(name, {}))) for name, task in TASKS.items() if name in EXPECTED]


def test_every_registered_task_is_made_from_its_data_section():
    """``cfg.task`` is the registered class made from ``cfg``, whose behaviour reads it; the
    sections with defaults need no field."""
    made = 0
    for name, cfg in built_in_configs():
        task = cfg.task
        assert type(task) is TASKS[name] and task.cfg is cfg and task.name == name
        made += 1
    assert made == len(EXPECTED) == 15
    with pytest.raises(AttnlabError, match="needs 'nodes' and 'edges'"):
        NodeClassificationConfig()  # the one section without defaults


def test_each_task_has_the_abilities_isinstance_finds():
    found = {name: {a.__name__ for a in ABILITIES if isinstance(cfg.task, a)} for name, cfg in built_in_configs()}
    assert found == EXPECTED


def test_a_task_whose_files_hold_no_splits_refuses_a_split_itself():
    """One signature for every evaluate_file: a split given to a task whose files hold none is
    refused in one line before the file is read (`evaluate` asks EvaluatesFileSplits first);
    forecasting's files hold splits, the last scored by default."""
    assert ForecastingConfig(path="unread.csv").task.file_splits == ("train", "valid", "test")
    with pytest.raises(UsageError) as refused:
        ClassificationConfig().task.evaluate_file(None, {}, {}, "no-such-file.tsv", "test")
    assert str(refused.value) == (
        "--split with --data is for files that hold splits; a file of data.task "
        "'classification' holds none: give --data FILE, or --split NAME alone"
    )


def test_a_searched_task_decodes_its_evaluations_by_the_search_it_is_given():
    task = CaptioningConfig().task
    assert task.search == Greedy()  # until `evaluate` gives it its own
    beam = Beam(width=3, lenpen=0.6)
    searching = task.searching(beam)
    assert searching.search is beam and searching.cfg is task.cfg and task.search == Greedy()


def test_pipelined_tasks_name_the_head_their_loss_reads():
    heads = {name: cfg.task.pipeline_head for name, cfg in built_in_configs() if isinstance(cfg.task, Pipelined)}
    assert heads == {
        "translation": "forward",
        "language_model": "forward",
        "classification": "classify",
        "masked_lm": "forward",
    }


def test_no_class_method_is_left_in_the_tasks_but_those_a_registry_reads():
    found = set()
    for path in sorted(TASKS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and any(
                        isinstance(d, ast.Name) and d.id == "classmethod" for d in item.decorator_list
                    ):
                        found.add((path.name, node.name, item.name))
    assert found == JUSTIFIED_CLASSMETHODS


def test_a_task_reads_its_own_section():
    """Behaviour reads self.cfg, not an argument: the sizes the section alone tells, without data."""
    qa = VisualQAConfig(scenes=Scenes(image_size=16)).task.data_shape()
    assert (qa.image_height, qa.image_width, qa.channels, qa.n_classes) == (16, 16, 3, 2)
    series = ForecastingConfig(path="unread.csv", columns="a,b,c", input_length=12, horizon=3).task.data_shape()
    assert (series.n_channels, series.input_length, series.horizon) == (3, 12, 3)
