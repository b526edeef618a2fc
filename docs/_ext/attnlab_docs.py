"""The docs site's generated reference pages, written before Sphinx reads its sources (``make docs``).

Nothing here names a class, family or task: every page comes from walking what the package declares.

- the Python API: ``attnlab.__all__`` and the ``__all__`` of each of its packages, one page a package, each
  name through autodoc; a public class or function without a docstring of its own is a warning (an error in
  the strict build);
- the config reference: every section of a config file (``attnlab.config.SECTIONS``); a section chosen by a
  key (model.arch, data.task) has one page per registered choice (the family and task registries), a plain
  section (train) one page; each lists every dataclass field, the fields of a config inside it (a family's
  ``stack``) as ``stack.n_layers``, with its type, default, the values ``one_of`` / ``at_least`` allow in
  the config's checks, and the comment on its line;
- the command reference: the parser of ``attnlab.cli.main.make_parser``, through sphinx-argparse.

Math is rendered at build time as MathML (latex2mathml): no script, no CDN, nothing to fetch when the page
is read; Chromium, Firefox and Safari draw MathML Core.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

GENERATED = "_generated"  # under the docs folder, ignored by git: remade by every build


# ---------------------------------------------------------------------------------------------- the Python API


def packages() -> list[str]:
    """attnlab and each package under it, by name (modules that are not packages are left to their package)."""
    import attnlab

    found = ["attnlab"]
    for info in pkgutil.walk_packages(attnlab.__path__, "attnlab."):
        if info.ispkg:
            found.append(info.name)
    return sorted(found)


def public_names(package: str) -> list[str]:
    """The package's ``__all__``; a package without one is an error (public names are declared, not guessed)."""
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None)
    if names is None:
        raise ValueError(f"{package} declares no __all__")
    return list(names)


def own_docstring(obj: Any) -> bool:
    """Whether a class or function carries a docstring of its own (a dataclass's generated signature is none)."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
        return bool(doc) and not (dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("))
    return bool(getattr(obj, "__doc__", None))


def api_page(package: str) -> tuple[str, list[str]]:
    """The reST page of a package's public names, and the public classes and functions that lack a docstring."""
    module = importlib.import_module(package)
    title = f"``{package}``"
    lines = [title, "=" * len(title), "", f".. module:: {package}", ""]
    summary = inspect.getdoc(module)
    if summary:
        lines += [summary, ""]
    names = public_names(package)
    if not names:
        lines += ["This package exports no names: its modules serve the commands of the command reference.", ""]
    undocumented = []
    for name in names:
        obj = getattr(module, name)
        target = f"{package}.{name}"
        if inspect.isclass(obj):
            lines += [f".. autoclass:: {target}", "   :members:", "   :show-inheritance:", ""]
        elif inspect.isroutine(obj):
            lines += [f".. autofunction:: {target}", ""]
        else:
            kind = "type alias" if typing.get_origin(obj) else type(obj).__name__
            lines += [f".. py:data:: {target}", f"   :type: {kind}", "", f"   {describe_value(obj)}", ""]
            continue
        if not own_docstring(obj):
            undocumented.append(target)
    return "\n".join(lines), undocumented


def describe_value(value: Any) -> str:
    """One line about a public constant: a registry's keys, a tuple's items, or its value."""
    if isinstance(value, dict):
        keys = ", ".join(f"``{k}``" for k in value) or "none yet"
        return f"A registry of {len(value)}: {keys}."
    if isinstance(value, (tuple, list, frozenset, set)):
        return "Its items: " + (", ".join(f"``{v}``" for v in value) or "none") + "."
    return f"``{value!r}``"


# ------------------------------------------------------------------------------------------- the config fields


@dataclasses.dataclass
class Field:
    """One row of a config page: ``path`` as written in the section (``stack.n_layers``)."""

    path: str
    type: str
    default: str
    allowed: str
    about: str


def type_name(hint: Any) -> str:
    """A field's type as a reader writes it: ``int``, ``float or None``, ``bool or str``."""
    if hint is type(None):
        return "None"
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        named = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(named + (["None"] if type(None) in args else []))
    if typing.get_origin(hint) is typing.Literal:
        return "str"
    return getattr(hint, "__name__", str(hint))


def default_text(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default) if not dataclasses.is_dataclass(f.default) else "(its fields below)"
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return "required"


def line_comments(cls: type) -> dict[str, str]:
    """The comment on each field's line in the classes of ``cls``'s MRO (``max_tokens: int = 4096  # ...``)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        for line in source.splitlines():
            code, _, comment = line.partition("  # ")
            name = code.strip().split(":")[0]
            if comment and name.isidentifier() and name in klass.__dict__.get("__annotations__", {}):
                found[name] = comment.strip()
    return found


def checks(cls: type) -> dict[str, str]:
    """The values each field allows, read from the ``one_of(field, value, VALID)`` and
    ``at_least(field, value, low)`` calls in the methods of ``cls``'s MRO (the checks that raise the
    ConfigError naming the field); a field name given by a loop over a tuple of names counts for each."""
    found: dict[str, str] = {}
    for klass in cls.__mro__:
        module = inspect.getmodule(klass)
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple):
                names = [e.value for e in node.iter.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Call):
                        inner.loop_var = node.target.id  # type: ignore[attr-defined]
                        inner.loop_names = names  # type: ignore[attr-defined]
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("one_of", "at_least")
                and len(node.args) == 3
            ):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                fields = [first.value]
            elif isinstance(first, ast.Name) and getattr(node, "loop_var", None) == first.id:
                fields = node.loop_names  # type: ignore[attr-defined]
            else:
                continue
            try:
                valid = eval(compile(ast.Expression(node.args[2]), "<check>", "eval"), vars(module))  # noqa: S307
            except Exception:  # an expression of the instance (self....): not a fixed set
                continue
            if node.func.id == "one_of":
                text = ", ".join(f"``{v}``" for v in valid)
            else:
                text = f">= {valid}"
            for name in fields:
                found.setdefault(name.rpartition(".")[2], text)
    return found


def config_fields(cls: type, prefix: str = "", defaults: Any = None) -> list[Field]:
    """Every field of a config dataclass, a nested config's fields after its own row as ``outer.inner``, at any
    depth; ``defaults``: the instance whose values are the defaults (a family's own ``stack``), else the class's."""
    from attnlab.config import FLAT

    hints = typing.get_type_hints(cls)
    comments, allowed = line_comments(cls), checks(cls)
    rows: list[Field] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        value = getattr(defaults, f.name) if defaults is not None else f.default
        if FLAT in f.metadata:  # a part written in this section: the rows of its fields that the section has,
            # a field the section checks itself too (classification's max_len >= 4) with the section's own check
            rows += [
                dataclasses.replace(r, allowed=allowed.get(r.path[len(prefix) :], r.allowed))
                for r in config_fields(hint, prefix, value)
                if r.path[len(prefix) :] in f.metadata[FLAT]
            ]
            continue
        literal = [a for a in typing.get_args(hint)] if typing.get_origin(hint) is typing.Literal else []
        nested = inspect.isclass(hint) and dataclasses.is_dataclass(hint)
        default = default_text(f) if defaults is None or nested else repr(value)
        rows.append(
            Field(
                prefix + f.name,
                type_name(hint),
                default,
                ", ".join(f"``{v}``" for v in literal) or allowed.get(f.name, ""),
                comments.get(f.name, ""),
            )
        )
        if nested:
            inner = value if dataclasses.is_dataclass(value) else None  # the outer config's own defaults for it
            rows += config_fields(hint, prefix + f.name + ".", inner)
    return rows


def sections() -> list[tuple[str, str | None, dict[str, type]]]:
    """Each config section: (section, the key that chooses its class or None, {choice: config class})."""
    from attnlab.config import SECTIONS, TypedConfig
    from attnlab.models import FAMILIES
    from attnlab.runs import train_config as run_config
    from attnlab.tasks import TASKS

    registries = {}
    for registry in (FAMILIES, TASKS):
        configs = {name: plugin.config for name, plugin in registry.items()}
        base = next(c for c in inspect.getmro(next(iter(configs.values()))) if TypedConfig in c.__bases__)
        registries[base.section] = (base.selector, configs)
    from attnlab.models.shape import DataShape

    plain = {
        c.section: c
        for c in vars(run_config).values()
        if inspect.isclass(c) and issubclass(c, TypedConfig) and c.__dict__.get("section") in SECTIONS
    }
    plain["shape"] = DataShape  # a model config's data sizes (a run's come from its data: shape.json)
    found = []
    for section in SECTIONS:
        if section in registries:
            found.append((section, *registries[section]))
        else:
            found.append((section, None, {section: plain[section]}))
    return found


def pairings() -> dict[tuple[str, str], list[str]]:
    """(section, choice) -> lines that link a family to the tasks it fits (``Task.fits`` its capabilities, the
    check of a training config) and a task to the families that fit it."""
    from attnlab.models import FAMILIES
    from attnlab.tasks import TASKS

    lines: dict[tuple[str, str], list[str]] = {}
    for name, family in FAMILIES.items():
        caps = family.capabilities
        have = [f.name.replace("_", " ") for f in dataclasses.fields(caps) if getattr(caps, f.name) is True]
        tasks = [t for t, task in TASKS.items() if task.fits(caps)]
        lines[("model", name)] = [
            f"Capabilities: {', '.join(have) or 'none of the optional ones'}; inputs: ``{caps.inputs}``.",
            "",
            "Tasks it fits (``data.task``): "
            + (", ".join(f":doc:`{t} <../tasks/{t}>`" for t in tasks) or "none")
            + ".",
            "",
        ]
    for name, task in TASKS.items():
        families = [f for f, family in FAMILIES.items() if task.fits(family.capabilities)]
        lines[("data", name)] = [
            "Families that fit it (``model.arch``): "
            + (", ".join(f":doc:`{f} <../families/{f}>`" for f in families) or "none")
            + ".",
            "",
        ]
    return lines


def table(rows: list[Field]) -> list[str]:
    lines = [
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: 22 12 14 30 40",
        "",
        "   * - field",
        "     - type",
        "     - default",
        "     - allowed",
        "     - about",
    ]
    for r in rows:
        lines += [
            f"   * - ``{r.path}``",
            f"     - {r.type}",
            f"     - ``{r.default}``",
            f"     - {r.allowed}",
            f"     - {escape(r.about)}",
        ]
    return lines


def escape(text: str) -> str:
    """A source comment as reST text: its stars and backquotes literal."""
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("`", "\\`").replace("|", "\\|").replace("_ ", "\\_ ")


def public_path(obj: Any) -> str:
    """Where the API reference documents ``obj``: the first package whose ``__all__`` exports it (else its module)."""
    for package in packages():
        module = importlib.import_module(package)
        if any(getattr(module, name, None) is obj for name in public_names(package)):
            return f"{package}.{obj.__name__}"
    return f"{obj.__module__}.{obj.__qualname__}"


def config_page(section: str, selector: str | None, choice: str, cls: type, related: list[str] | None = None) -> str:
    title = f"{section}.{selector}: {choice}" if selector else f"The {section} section"
    lines = [title, "=" * len(title), ""]
    if selector:
        lines += [f"``{section}: {{{selector}: {choice}}}`` reads :class:`{public_path(cls)}`.", ""]
    doc = cls.__dict__.get("__doc__")
    if doc and own_docstring(cls):
        lines += [inspect.cleandoc(doc), ""]
    lines += related or []
    lines += [f"Set a field in a config file's ``{section}:`` section or with ``--set {section}.FIELD=VALUE``.", ""]
    fields = config_fields(cls)
    if not fields:  # a family with nothing to choose (the naive forecast)
        return "\n".join(lines[:-2] + ["It has no fields: nothing to choose.", ""])
    return "\n".join(lines + table(fields) + [""])


# ----------------------------------------------------------------------------------------------- the pages


def pages() -> tuple[dict[str, str], list[str]]:
    """Every generated page, path under the docs folder -> reST text, and the undocumented public names."""
    out: dict[str, str] = {}
    undocumented: list[str] = []
    for package in packages():
        out[f"{GENERATED}/api/{package}.rst"], missing = api_page(package)
        undocumented += missing
    related = pairings()
    for section, selector, configs in sections():
        folder = {"model": "families", "data": "tasks"}.get(section, section)
        for choice, cls in configs.items():
            name = choice if selector else section
            out[f"{GENERATED}/config/{folder}/{name}.rst"] = config_page(
                section, selector, choice, cls, related.get((section, choice), [])
            )
    out[f"{GENERATED}/cli.rst"] = "\n".join(
        [
            "Commands",
            "========",
            "",
            "Every command and option of ``attnlab``, read from its parser (``attnlab.cli.main.make_parser``).",
            "",
            ".. argparse::",
            "   :module: attnlab.cli.main",
            "   :func: make_parser",
            "   :prog: attnlab",
            "",
        ]
    )
    return out, undocumented


def write_pages(app: Any) -> None:
    """builder-inited: (re)write the generated pages, each only where its text changed (incremental builds)."""
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    root = Path(app.srcdir)
    texts, undocumented = pages()
    for name in undocumented:
        logger.warning(f"public name without a docstring: {name}")
    for relative, text in texts.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    for stale in (root / GENERATED).rglob("*.rst"):  # a family, task or package that is gone
        if str(stale.relative_to(root)) not in texts:
            stale.unlink()


# ------------------------------------------------------------------------------------------------------ math


def mathml(latex: str, display: bool) -> str:
    """LaTeX as a MathML element (inline, or a block)."""
    import latex2mathml.converter

    return latex2mathml.converter.convert(latex, display="block" if display else "inline")


def visit_math(self: Any, node: Any) -> None:
    self.body.append(mathml(node.astext(), display=False))
    from docutils import nodes

    raise nodes.SkipNode


def visit_displaymath(self: Any, node: Any) -> None:
    from docutils import nodes

    self.body.append(self.starttag(node, "div", CLASS="math"))
    for part in node.astext().split("\n\n"):  # a blank line separates equations
        self.body.append(mathml(part.strip(), display=True))
    self.body.append("</div>\n")
    raise nodes.SkipNode


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", write_pages)
    app.add_html_math_renderer("mathml", (visit_math, None), (visit_displaymath, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
