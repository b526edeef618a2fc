"""The docs site's generated reference (docs/_ext/attnlab_docs.py) against the code it is generated from:
every public name, every config field of every family, task and the train section with the default and the
allowed values the config classes themselves hold, and every command and option of the parser. The strict
build itself runs in `make test` (`make docs`); these tests write nothing into the tree."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
import sys
import types
from pathlib import Path
from typing import Literal, Optional

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
PUBLIC_NAMES = Path(__file__).resolve().parent / "public_names.txt"
sys.path.insert(0, str(DOCS / "_ext"))

import attnlab_docs  # noqa: E402  (docs/_ext is no package)

from attnlab.cli.main import make_parser  # noqa: E402
from attnlab.config import FLAT, TypedConfig, at_least, field_paths, one_of  # noqa: E402
from attnlab.errors import ConfigError  # noqa: E402


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    pages, undocumented = attnlab_docs.pages()
    assert undocumented == []  # the strict build's check: every public class and function has a docstring
    return pages


def rows(page: str) -> dict[str, list[str]]:
    """A config page's table: field -> [type, default (its literal's text), allowed, about]."""
    found: dict[str, list[str]] = {}
    for block in page.split("   * - ")[2:]:  # the first is before the table, the second its header row
        cells = [c.strip() for c in block.split("\n     - ")]
        kind, default, allowed, about = cells[1:]
        found[cells[0].strip("`")] = [kind, default.removeprefix("``").removesuffix("``"), allowed, about]
    return found


def test_every_package_declares_its_public_names_and_each_has_its_page(generated):
    for package in attnlab_docs.packages():
        module = importlib.import_module(package)
        assert isinstance(getattr(module, "__all__", None), list), f"{package} has no __all__"
        page = generated[f"_generated/api/{package}.rst"]
        for name in module.__all__:
            assert re.search(rf"^\.\. (autoclass|autofunction|py:data):: {re.escape(package)}\.{name}$", page, re.M), (
                f"{package}.{name} is not on its API page"
            )
    assert len(generated["_generated/api/attnlab.rst"].split(".. auto")) - 1 >= 9  # 5 errors, 4 functions


def public_names_now() -> list[str]:
    return sorted(
        f"{package}.{name}" for package in attnlab_docs.packages() for name in importlib.import_module(package).__all__
    )


def test_the_public_names_grow_only_deliberately():
    """Every package's ``__all__`` against tests/public_names.txt: a name added to an ``__all__`` is
    added to the list in the same commit, and a name listed must still be there (a user imports it)."""
    listed = PUBLIC_NAMES.read_text().splitlines()
    listed = [line for line in listed if line and not line.startswith("#")]
    assert listed == sorted(set(listed)), "tests/public_names.txt: keep it sorted, each name once"
    now = public_names_now()
    added, gone = sorted(set(now) - set(listed)), sorted(set(listed) - set(now))
    assert not added, f"public names not in tests/public_names.txt (add them deliberately): {added}"
    assert not gone, f"public names gone from their package's __all__ (a user's import breaks): {gone}"


def test_the_readme_names_resolve_from_their_packages():
    from attnlab.analysis import capture_attention
    from attnlab.analysis.capture import capture_attention as in_module
    from attnlab.data import scan_commands

    assert capture_attention is in_module
    assert ("jump", "I_JUMP") in scan_commands()


def test_a_public_name_without_a_docstring_is_reported(monkeypatch):
    """The check behind the strict build's 'undocumented public name': a dataclass whose only docstring is
    the one dataclasses writes, and a bare function, are reported; a documented function is not."""
    fake = types.ModuleType("attnlab_fake_package", "A package for this test.")

    @dataclasses.dataclass
    class Bare:
        size: int = 1

    def bare() -> None:
        pass

    def documented() -> None:
        """Documented."""

    fake.Bare, fake.bare, fake.documented, fake.LIMITS = Bare, bare, documented, (1, 2)
    fake.__all__ = ["Bare", "bare", "documented", "LIMITS"]
    monkeypatch.setitem(sys.modules, "attnlab_fake_package", fake)
    page, undocumented = attnlab_docs.api_page("attnlab_fake_package")
    assert undocumented == ["attnlab_fake_package.Bare", "attnlab_fake_package.bare"]
    assert "Its items: ``1``, ``2``." in page


def defaults(cls: type, prefix: str = "", given: object = None) -> list[tuple[str, str]]:
    """Each field's path and its default as the page must print it: a part's fields (a family's
    stack, its backends' options, at any depth) with the defaults the outer config gives that part."""
    found = []
    for f in dataclasses.fields(cls):
        value = getattr(given, f.name) if given is not None else f.default
        if FLAT in f.metadata:  # a part written in the section itself: its fields that the section has
            found += [(path, text) for path, text in defaults(type(value), prefix, value) if path in f.metadata[FLAT]]
        elif dataclasses.is_dataclass(value):
            found += [(f"{prefix}{f.name}", "(its fields below)"), *defaults(type(value), f"{prefix}{f.name}.", value)]
        elif value is not dataclasses.MISSING:
            found.append((f"{prefix}{f.name}", repr(value)))
    return found


def test_every_field_of_every_section_is_on_its_page_with_its_default(generated):
    from attnlab.models import FAMILIES, DataShape
    from attnlab.runs.train_config import TrainConfig
    from attnlab.tasks import TASKS

    expected = {f"_generated/config/families/{n}.rst": f.config for n, f in FAMILIES.items()}
    expected |= {f"_generated/config/tasks/{n}.rst": t.config for n, t in TASKS.items()}
    expected["_generated/config/train/train.rst"] = TrainConfig
    expected["_generated/config/shape/shape.rst"] = DataShape  # a model config's sizes (a run's: shape.json)
    assert {p for p in generated if "/config/" in p} == set(expected)
    for path, cls in expected.items():
        table = rows(generated[path])
        assert list(table) == field_paths(cls), path
        for name, default in defaults(cls):
            assert table[name][1] == default, (path, name)
    vit = rows(generated["_generated/config/families/vit.rst"])
    assert vit["stack.n_layers"][1] == "12" and vit["stack.norm"][1] == "'pre'" and vit["patches.size"][1] == "16"
    shape = rows(generated["_generated/config/shape/shape.rst"])
    assert shape["vocab_size"][1] == "None" and shape["pad_id"][1] == "0" and "n_classes" not in vit


CHOICES = ("fast", "exact")


@dataclasses.dataclass(frozen=True)
class Inner(TypedConfig):
    mode: str = "fast"  # how it runs
    size: int = 4

    def __post_init__(self) -> None:
        one_of("mode", self.mode, CHOICES)
        for name in ("size",):
            at_least(name, getattr(self, name), 2)


@dataclasses.dataclass(frozen=True)
class Middle(TypedConfig):
    inner: Inner = Inner(size=8)
    depth: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Outer(TypedConfig):
    middle: Middle = Middle(inner=Inner(mode="exact", size=16))
    name: Literal["a", "b"] = "a"


def test_composed_configs_at_any_depth_with_the_outer_configs_defaults():
    """The generator walks dataclass fields, not class names: a config composed of configs composed of
    configs lists every field once, with the defaults the outermost config gives its parts."""
    table = {r.path: r for r in attnlab_docs.config_fields(Outer)}
    assert (
        list(table)
        == field_paths(Outer)
        == ["middle", "middle.inner", "middle.inner.mode", "middle.inner.size", "middle.depth", "name"]
    )
    assert table["middle.inner.mode"].default == "'exact'" and table["middle.inner.size"].default == "16"
    assert table["middle.depth"].type == "int or None" and table["middle.depth"].default == "None"
    assert table["middle.inner.mode"].allowed == "``fast``, ``exact``" and table["middle.inner.size"].allowed == ">= 2"
    assert table["middle.inner.mode"].about == "how it runs" and table["name"].allowed == "``a``, ``b``"
    assert {r.path: r.default for r in attnlab_docs.config_fields(Middle)}["inner.size"] == "8"


def test_families_and_tasks_link_where_a_training_config_accepts_the_pair(generated):
    """Each family page lists the tasks, each task page the families, for which a run config's own check
    (runs/config.py's _check_fits) accepts the pair, and no other."""
    from attnlab.models import FAMILIES
    from attnlab.runs.config import _check_fits
    from attnlab.tasks import TASKS

    def accepted(family, task) -> bool:
        try:
            _check_fits(family, task)
        except ConfigError:
            return False
        return True

    def linked(page: str, kind: str) -> list[str]:
        return re.findall(rf":doc:`(\w+) <\.\./{kind}/\1>`", page)

    pairs = {(f, t) for f, family in FAMILIES.items() for t, task in TASKS.items() if accepted(family, task)}
    assert ("decoder_lm", "language_model") in pairs and ("vit", "translation") not in pairs
    for f in FAMILIES:
        page = generated[f"_generated/config/families/{f}.rst"]
        assert linked(page, "tasks") == [t for t in TASKS if (f, t) in pairs], f
    for t in TASKS:
        page = generated[f"_generated/config/tasks/{t}.rst"]
        assert linked(page, "families") == [f for f in FAMILIES if (f, t) in pairs], t


def test_the_allowed_values_are_those_the_config_checks_accept(generated):
    """Each allowed list on the train page is exactly what the ConfigError of a wrong value lists."""
    from attnlab.runs.train_config import TrainConfig

    table = rows(generated["_generated/config/train/train.rst"])
    listed = {name: re.findall(r"``([^`]+)``", row[2]) for name, row in table.items() if "``" in row[2]}
    assert {"optimizer", "lr_schedule", "precision", "sampling", "loss_reduction", "strategy"} <= set(listed)
    for name, values in listed.items():
        with pytest.raises(ConfigError) as refused:
            TrainConfig(**{name: "no-such-value"})
        assert re.findall(r"'([^']+)'", str(refused.value).split("(got")[0]) == values, name
    assert table["max_steps"][2] == ">= 1" and table["warmup_steps"][2] == ">= 0"
    # a field of a part written flat in a data section: the part's check, or the section's own where it has one
    allowed = {task: rows(generated[f"_generated/config/tasks/{task}.rst"]) for task in ("classification", "encoder")}
    assert allowed["classification"]["max_len"][2] == ">= 4" and allowed["encoder"]["max_len"][2] == ">= 3"
    assert rows(generated["_generated/config/tasks/language_model.rst"])["block_size"][2] == ">= 1"
    stack = rows(generated["_generated/config/families/decoder_lm.rst"])
    from attnlab.nn.registry import ATTENTION_BACKENDS

    assert re.findall(r"``([^`]+)``", stack["stack.attention_backend"][2]) == list(ATTENTION_BACKENDS)


def options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str, bool]]:
    """(command path, option string, positional name or subcommand, whether it is a subcommand) of every
    argument of every (sub)command."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((path, name, True))
                found += options(sub, (*path, name))
        elif not isinstance(action, argparse._HelpAction):
            positional = action.metavar if isinstance(action.metavar, str) else action.dest  # as argparse shows it
            found += [(path, s, False) for s in action.option_strings] or [(path, positional, False)]
    return found


def test_the_command_reference_lists_every_command_and_option(generated, tmp_path):
    """The command page built by Sphinx (text builder, in a temporary folder) against the parser: every
    subcommand has its heading, every option and positional its entry in its own command's part."""
    from sphinx.application import Sphinx

    (tmp_path / "conf.py").write_text("extensions = ['sphinxarg.ext']\n")
    (tmp_path / "index.rst").write_text(generated["_generated/cli.rst"])
    app = Sphinx(
        str(tmp_path),
        str(tmp_path),
        str(tmp_path / "out"),
        str(tmp_path / "doctrees"),
        "text",
        status=None,
        warning=None,
        freshenv=True,
    )
    app.build()
    text = (tmp_path / "out" / "index.txt").read_text()
    wanted = options(make_parser())
    assert len(wanted) > 200 and ((), "train", True) in wanted and (("train",), "--set", False) in wanted
    # each command's part of the page starts at its usage line, `attnlab train [-h] ...`
    parts = {
        tuple(m.group(1).split()): m.group(0)
        for m in re.finditer(r"^   (?:usage: )?attnlab ((?:[\w-]+ )*?)\[-h\].*?(?=^   attnlab |\Z)", text, re.M | re.S)
    }
    missing = []
    for path, name, command in wanted:
        if command:
            found = (*path, name) in parts and re.search(rf"^{re.escape(name)}\n[-~\"^=*]+$", text, re.M)
        else:
            found = re.search(rf"^(.*, )?{re.escape(name)}(, .*)?$", parts.get(path, ""), re.M)
        if not found:
            missing.append((" ".join(path), name))
    assert missing == []
    # the parts are the commands' own: an option of `info` that `train` lacks is in one part, not the other
    only_info = next(
        n for p, n, _ in wanted if p == ("info",) and n.startswith("--") and (("train",), n, False) not in wanted
    )
    assert re.search(rf"^{only_info}$", parts[("info",)], re.M) and not re.search(
        rf"^{only_info}$", parts[("train",)], re.M
    )


def test_math_is_mathml_written_at_build_time():
    block = attnlab_docs.mathml(r"\mathrm{softmax}\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V", display=True)
    assert block.startswith('<math xmlns="http://www.w3.org/1998/Math/MathML" display="block">')
    assert "<mfrac>" in block and "<msqrt>" in block and "<msub>" in block
