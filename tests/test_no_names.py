"""serve/, its page's script, analysis/, bench/ and cli/ ask a task or family what it can do; none
selects behaviour by a registered task's or family's name (issue 61).

The names are read from the registries (``TASKS``, ``FAMILIES``). A string constant equal to one
of them *selects* when it is

- an operand of a comparison (``==``, ``!=``, ``in``, ``not in``, ``is``), or an element of a
  tuple, list or set compared with ``in``;
- a key of a dict literal (or an element of a tuple key), or the index of a subscript
  (``FIELDS["translation"]``);
- a ``match`` case's value;
- the attribute named in ``getattr``, ``hasattr`` or ``setattr``.

A ``getattr``/``hasattr``/``setattr`` whose attribute is an f-string built from a task, arch or
family (an interpolated expression mentioning ``task``, ``arch`` or ``family``:
``getattr(self, f"_{self.task}")``) selects too, whatever its constant parts.

A word that also names a part of a model is judged by what it selects: a comparison whose other
operand is a stack (an expression mentioning ``stack``: ``record.stack == "encoder"``) selects a
stack; so does a dict literal bound to a variable that is only looked up by stack (``axes =
{("encoder", "self"): ...}`` read as ``axes[r.stack, r.kind]`` or ``axes.get((r.stack, r.kind))``);
and a dict literal whose keys are all :class:`Capabilities` fields (``{"encoder": True,
"decoder": True}``) states capabilities. None of these is flagged. Everything else is not selecting:
a name as a value (``dict(arch="decoder_lm", ...)`` building a benchmark's model), an argument
(``suite("encoder", ...)``, a benchmark suite's name), or text in a message.

The page's script (serve/static/*.js) is read with a regex over its string literals: one that
equals a registered name is flagged unless it is compared with a stack (``map.stack === ...``).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from attnlab.models import FAMILIES, Capabilities
from attnlab.tasks import TASKS

PACKAGE = Path(__file__).resolve().parents[1] / "attnlab"
SCANNED = ("serve", "analysis", "bench", "cli")
CAPABILITIES = frozenset(f.name for f in dataclasses.fields(Capabilities))
ATTRIBUTE_CALLS = frozenset({"getattr", "hasattr", "setattr"})
NAMING = frozenset({"task", "arch", "family"})


def registered_names() -> frozenset[str]:
    return frozenset(TASKS) | frozenset(FAMILIES)


def mentions(node: ast.AST, words: frozenset[str]) -> bool:
    """Whether ``node`` reads a variable or attribute named one of ``words``."""
    return any(
        isinstance(n, ast.Name) and n.id in words or isinstance(n, ast.Attribute) and n.attr in words
        for n in ast.walk(node)
    )


def selecting_uses(source: str, names: frozenset[str]) -> list[tuple[int, str]]:
    """(line, what) of each use of a registered name in Python ``source`` that selects behaviour."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ATTRIBUTE_CALLS
            and len(node.args) > 1
            and isinstance(node.args[1], ast.JoinedStr)
            and any(mentions(part, NAMING) for part in node.args[1].values if isinstance(part, ast.FormattedValue))
        ):
            found.append((node.lineno, f"{node.func.id} of an attribute named after a task or family"))
        if isinstance(node, ast.Constant) and node.value in names:
            use = selection(node, parents)
            if use is not None:
                found.append((node.lineno, f"{node.value!r} {use}"))
    return found


def selection(constant: ast.Constant, parents: dict[ast.AST, ast.AST]) -> str | None:
    """How ``constant`` selects behaviour (see the module docstring), or None where it does not."""
    node, parent = constant, parents.get(constant)
    if isinstance(parent, (ast.Tuple, ast.List, ast.Set)):  # an element: judged by what holds the collection
        node, parent = parent, parents.get(parent)
    if isinstance(parent, ast.Compare):
        others = [operand for operand in (parent.left, *parent.comparators) if operand is not node]
        return None if any(mentions(other, frozenset({"stack"})) for other in others) else "compared"
    if isinstance(parent, ast.Dict) and node in parent.keys:
        keys = [k.value for k in parent.keys if isinstance(k, ast.Constant)]
        capabilities = len(keys) == len(parent.keys) and set(keys) <= CAPABILITIES
        return None if capabilities or looked_up_by_stack(parent, parents) else "as a dict key"
    if isinstance(parent, ast.Subscript) and parent.slice is node:
        return "as an index"
    if isinstance(parent, ast.MatchValue):
        return "as a match case"
    if (
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Name)
        and parent.func.id in ATTRIBUTE_CALLS
        and len(parent.args) > 1
        and parent.args[1] is node
    ):
        return f"named in {parent.func.id}"
    return None


def looked_up_by_stack(literal: ast.Dict, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether the dict ``literal`` is bound to a variable (``name = {...}``) that its scope reads only
    by stack: ``name[...]`` and ``name.get(...)``, each with a key mentioning ``stack``."""
    bound = parents.get(literal)
    if not (isinstance(bound, ast.Assign) and len(bound.targets) == 1 and isinstance(bound.targets[0], ast.Name)):
        return False
    name, scope = bound.targets[0].id, parents.get(bound)
    keys = []
    for node in ast.walk(scope):
        if isinstance(node, ast.Name) and node.id == name and node is not bound.targets[0]:
            user = parents.get(node)
            if isinstance(user, ast.Subscript) and user.value is node:
                keys.append(user.slice)
            elif isinstance(user, ast.Attribute) and user.attr == "get" and isinstance(parents.get(user), ast.Call):
                keys.append(parents[user].args[0])
            else:  # read some other way: judged as a dict keyed by name
                return False
    return bool(keys) and all(mentions(key, frozenset({"stack"})) for key in keys)


JS_STRING = re.compile(r"""(["'`])((?:\\.|(?!\1).)*)\1""")
JS_STACK_COMPARISON = re.compile(r"stack\s*[!=]==?\s*$")


def selecting_js(source: str, names: frozenset[str]) -> list[tuple[int, str]]:
    """(line, literal) of each string literal of a script equal to a registered name, not compared with a stack."""
    found = []
    for match in JS_STRING.finditer(source):
        if match[2] in names:
            before = source[: match.start()]
            if not JS_STACK_COMPARISON.search(before.rsplit("\n", 1)[-1]):
                found.append((before.count("\n") + 1, match[0]))
    return found


def scanned_files() -> list[Path]:
    return sorted(p for folder in SCANNED for p in (PACKAGE / folder).rglob("*") if p.suffix in (".py", ".js"))


def test_serve_analysis_bench_and_cli_select_no_task_or_family_by_name():
    names = registered_names()
    found = []
    for path in scanned_files():
        scan = selecting_uses if path.suffix == ".py" else selecting_js
        found += [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}" for line, what in scan(path.read_text(), names)]
    assert found == []


NAMES = frozenset({"translation", "encoder", "decoder_lm"})


@pytest.mark.parametrize(
    "source, expected",
    [
        ('if task == "translation":\n    pass', [(1, "'translation' compared")]),
        ('ok = name in ("translation", "other")', [(1, "'translation' compared")]),
        ('FIELDS = {"translation": {}, "x": 1}', [(1, "'translation' as a dict key")]),
        ('axes = {("encoder", "self"): 0}\nfor k in axes: pass', [(1, "'encoder' as a dict key")]),
        ('axes = {("encoder", "self"): 0}\nrow = axes[r.stack, r.kind]\nn = axes.get((r.stack, r.kind), 3)', []),
        ('x = FIELDS["translation"]', [(1, "'translation' as an index")]),
        ('match task:\n    case "translation":\n        pass', [(2, "'translation' as a match case")]),
        ('f = getattr(self, "encoder")', [(1, "'encoder' named in getattr")]),
        ('f = getattr(self, f"_{self.task}")', [(1, "getattr of an attribute named after a task or family")]),
        ('f = getattr(cfg, f"{stack}_layers")', []),  # a stack's attribute
        ('if record.stack == "encoder":\n    pass', []),  # a stack, not the task 'encoder'
        ('same = (r.stack, r.kind) == ("encoder", "self")', []),
        ('NEEDS = {"encoder": True, "decoder": True}', []),  # capabilities, not the task
        ('MODEL = dict(arch="decoder_lm", d_model=8)', []),  # a config being built: a value
        ('model = {"arch": "decoder_lm"}', []),
        ('suite("encoder", "forward tokens/s")', []),  # an argument: a suite's own name
        ('raise UsageError("a translation run")', []),
    ],
)
def test_the_scan_finds_a_name_where_it_selects_and_only_there(source, expected):
    assert selecting_uses(source, NAMES) == expected


def test_the_scan_of_the_script_spares_a_stack_alone():
    script = (
        'if (task === "translation") draw();\n'
        'const row = map.stack === "encoder" ? 0 : -1;\n'
        'const kinds = ["encoder", "x"];\n'
        "const label = `encoder`;\n"
    )
    assert selecting_js(script, NAMES) == [(1, '"translation"'), (3, '"encoder"'), (4, "`encoder`")]
