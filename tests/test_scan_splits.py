"""SCAN's generalisation splits, derived from their rules (attnlab/data/scan.py): the published
sizes, disjoint where they should be, the length split's training set exactly the published one
(as a set), and `attnlab data scan` / the built-in task's `split`."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from attnlab import ConfigError, task_config
from attnlab.data.corpora import read_scan
from attnlab.data.scan import SCAN_SPLITS, scan_commands, scan_lines, scan_split
from attnlab.tasks.translation import read_pairs

from helpers import run_cli

# (train, test): Lake & Baroni (2018) and Loula et al. (2018) as published (issue 41: compared line by
# line, the published template files leave out the 1,209 commands that apply the template to 'turn')
SIZES = {
    "simple": (16_728, 4_182),
    "length": (16_990, 3_920),
    "add_prim_jump": (14_670, 7_706),
    "add_prim_turn_left": (21_890, 1_208),
    "template_jump_around_right": (18_528, 1_173),
    "template_around_right": (15_225, 4_476),
    "template_opposite_right": (15_225, 4_476),
    "template_right": (15_225, 4_476),
}
LEFT_OUT = {
    "template_jump_around_right": "turn around right",
    "template_around_right": "turn around right",
    "template_opposite_right": "turn opposite right",
    "template_right": "turn right",
}

# sha256 of the sorted, distinct lines of the published length_split/tasks_train_length.txt
# (brendenlake/SCAN at c4b756c, as in ../shared/data/scan), joined by newlines
LENGTH_TRAIN_SET = "114e6bdb1575f27d8d6d4449081970cef4846b2ec89b260dc2a0e5297c3e75d5"


@pytest.fixture(scope="module")
def splits():
    return {name: scan_split(name) for name in SCAN_SPLITS}


def commands(pairs) -> set[str]:
    return {command for command, _ in pairs}


def test_every_split_has_its_size(splits):
    assert {name: (len(train), len(test)) for name, (train, test) in splits.items()} == SIZES


def test_train_and_test_share_no_command_and_cover_the_grammar(splits):
    """... all of it but, in a template split, the commands that apply the template to 'turn'."""
    everything = commands(scan_commands())
    for name, (train, test) in splits.items():
        assert not commands(train) & commands(test), name
        left_out = {c for c in everything if name in LEFT_OUT and f" {LEFT_OUT[name]} " in f" {c} "}
        assert commands(train) | commands(test) == everything - left_out, name
        assert len(left_out) == (1_209 if name in LEFT_OUT else 0), name
        assert len(commands(test)) == len(test), name  # no test command twice


def test_the_length_rule_reproduces_the_published_training_set(splits):
    train, test = splits["length"]
    lines = sorted(set(scan_lines(train).splitlines()))
    assert hashlib.sha256("\n".join(lines).encode()).hexdigest() == LENGTH_TRAIN_SET
    assert max(len(a.split()) for _, a in train) == 22 and min(len(a.split()) for _, a in test) == 24


@pytest.mark.parametrize(
    "name, primitive, copies", [("add_prim_jump", "jump", 1_467), ("add_prim_turn_left", "turn left", 2_189)]
)
def test_an_added_primitive_is_seen_alone_and_tested_in_every_composition(splits, name, primitive, copies):
    train, test = splits[name]
    assert sum(command == primitive for command, _ in train) == copies
    assert all(f" {primitive} " not in f" {c} " for c, _ in train if c != primitive)
    assert all(f" {primitive} " in f" {c} " and c != primitive for c, _ in test)


def test_the_templates_hold_out_their_phrase_and_keep_its_parts(splits):
    train, test = splits["template_around_right"]
    assert "jump around right" in commands(test) and "turn around right" not in commands(train) | commands(test)
    assert {"jump around left", "jump right", "walk opposite right", "turn around left"} <= commands(train)
    train, test = splits["template_right"]
    assert "look right twice" in commands(test) and "look opposite right" in commands(train)
    assert commands(splits["template_jump_around_right"][1]) < commands(splits["template_around_right"][1])


def test_the_simple_split_is_drawn_from_its_seed(splits):
    again, other = scan_split("simple", 0), scan_split("simple", 1)
    assert again == splits["simple"] and commands(other[1]) != commands(again[1])


def test_data_scan_writes_the_published_format(tmp_path):
    done = run_cli("data", "scan", "--split", "add_prim_jump", "--out", str(tmp_path / "jump"))
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout == f"{tmp_path / 'jump'}: tasks_train.txt (14,670 pairs), tasks_test.txt (7,706 pairs), "
        f"split add_prim_jump\n"
    )
    assert read_scan(tmp_path / "jump" / "tasks_test.txt") == scan_split("add_prim_jump")[1]
    assert (tmp_path / "jump" / "tasks_train.txt").read_text().startswith("IN: walk OUT: I_WALK\n")
    again = run_cli("data", "scan", "--split", "length", "--out", str(tmp_path / "jump"))
    assert again.returncode == 2 and "tasks_train.txt already exists; pass --force" in again.stderr
    assert read_scan(tmp_path / "jump" / "tasks_test.txt") == scan_split("add_prim_jump")[1]  # untouched
    wrong = run_cli("data", "scan", "--split", "lenght", "--out", str(tmp_path / "x"))
    assert wrong.returncode == 2 and "(did you mean 'length'?)" in wrong.stderr and not Path(tmp_path / "x").exists()


def test_the_builtin_task_takes_a_split():
    pairs = read_pairs(
        task_config({"format": "builtin", "generator": {"name": "scan", "split": "length"}, "n_valid": 100, "seed": 3})
    )
    train, test = scan_split("length")
    assert pairs["test"] == test and len(pairs["valid"]) == 100 and len(pairs["train"]) == 16_890
    assert sorted(pairs["train"] + pairs["valid"]) == sorted(train)
    with pytest.raises(
        ConfigError, match=r"generator.split is one of SCAN's splits: it needs name 'scan' \(got 'copy'\)"
    ):
        task_config({"format": "builtin", "generator": {"name": "copy", "split": "length"}})
    with pytest.raises(ConfigError, match="split must be one of 'simple'"):
        task_config({"format": "builtin", "generator": {"name": "scan", "split": "jump"}})
