"""Typed configuration: dataclasses that check themselves when built and round-trip through YAML/JSON.

A config file is a YAML (or JSON) mapping with one section per dataclass::

    model:
      arch: encoder_decoder
      vocab_size: 37000
      d_model: 512

Every problem is reported as a :class:`~attnlab.errors.ConfigError` that names the field (with the
file when there is one), the value given and the values allowed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Self, TypeVar

import yaml

from attnlab.config_files import dump_yaml, parse_file, parse_yaml
from attnlab.errors import ConfigError

# The sections a config file may hold, each parsed by its own dataclass; 'shape' (models/shape.py), the
# data's sizes, only in a model config without data (`attnlab info`): a run's come from its data.
SECTIONS = ("model", "data", "train", "shape")

P = TypeVar("P")  # a registered plugin: a model family or a task class
FLAT = "flat"  # a field's metadata key: the part it holds is written flattened into its section


def flattened(default: Any, fields: tuple[str, ...] = ()) -> Any:
    """A composed part whose fields are written in the section that holds it, beside the section's own
    (``files: Files = flattened(Files())`` reads and writes ``data.train``, not ``data.files.train``):
    one class in the code, one level in the file. ``fields``: the part's fields the section has (all
    by default); the others keep the part's defaults, and a section that names one is refused like
    any unknown field. Only a section's own fields may be flattened parts."""
    names = fields or tuple(f.name for f in dataclasses.fields(default))
    return dataclasses.field(default=default, metadata={FLAT: names})


def _flat_parts(cls: type) -> dict[str, tuple[str, ...]]:
    """A config class's flattened parts: field name -> the part's fields that the section has."""
    return {f.name: f.metadata[FLAT] for f in dataclasses.fields(cls) if FLAT in f.metadata}


def did_you_mean(word: str, choices: typing.Iterable[str], written: dict[str, str] | None = None) -> str:
    """' (did you mean 'x'?)' when a choice is close to ``word``, else ''; ``written``: how a choice
    is written where that is not its name ('d_model' -> 'stack.d_model')."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean '{(written or {}).get(close[0], close[0])}'?)" if close else ""


def one_of(field: str, value: Any, valid: typing.Iterable[str]) -> None:
    """Raise a ConfigError unless ``value`` is one of ``valid``; the message lists them all."""
    valid = list(valid)
    if value not in valid:
        listed = ", ".join(repr(v) for v in valid)
        raise ConfigError(f"{field} must be one of {listed} (got {value!r}){did_you_mean(str(value), valid)}")


def _type_name(tp: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _coerce(field: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against a field's type hint: int, float, str, bool, a Literal of values, Optional
    of them, or a union of them (`bool | str`: the first that takes the value)."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:  # `Literal["a", "b"]`: one of the listed values
        one_of(field, value, typing.get_args(hint))
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(kinds) > 1:  # `bool | str`: the first type that takes the value
            for kind in kinds:
                with contextlib.suppress(ConfigError):
                    return _coerce(field, value, kind)
            raise ConfigError(f"{field} must be {' or '.join(_type_name(k) for k in kinds)} (got {value!r})")
        hint = kinds[0]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{field} must be a finite number (got {value})")
    # bool is a subclass of int: `d_model: true` must not pass as 1.
    if not isinstance(value, hint) or (hint is not bool and isinstance(value, bool)):
        raise ConfigError(f"{field} must be {_type_name(hint)} (got {value!r})")
    return value


def _is_config(hint: Any) -> bool:
    """A config part: a TypedConfig, or a plain dataclass (a part that a module below this one owns,
    such as an attention backend's options, nn/backends/), whose fields are checked here."""
    return isinstance(hint, type) and (issubclass(hint, TypedConfig) or dataclasses.is_dataclass(hint))


def _nested(f: dataclasses.Field[Any], value: Any, hint: type, where: str = "") -> Any:
    """A config inside a config (a family's ``stack``, its ``backends``): a mapping overrides the
    field's default (the family's) field by field; a config of the field's class is taken as it is.
    ``where``: the path of the config that holds it ('model.backends')."""
    if isinstance(value, hint):
        return value
    section = getattr(hint, "section", f"{where}{f.name}")
    if not isinstance(value, dict):
        raise ConfigError(f"{section} must be a mapping of field: value (got {value!r})")
    if not isinstance(f.default, hint) or not dataclasses.is_dataclass(f.default):
        raise TypeError(f"field '{f.name}' holds a {hint.__name__}: its default must be one, which a mapping overrides")
    merged = {**{g.name: getattr(f.default, g.name) for g in dataclasses.fields(f.default)}, **value}
    if issubclass(hint, TypedConfig):
        return hint.from_dict(merged)
    return _part(hint, merged, section)


def _as_written(err: ConfigError, cls: type) -> ConfigError:
    """``err``, raised while a config of ``cls`` was built or checked, naming a field of one of its
    flattened parts as the section writes it: 'n_valid must be >= 1', not 'splits.n_valid ...'."""
    text, hints = str(err), typing.get_type_hints(cls)
    for name in _flat_parts(cls):
        text = text.removeprefix(f"{getattr(hints[name], 'section', '').partition('.')[2]}.")
    return ConfigError(text)


def _part(cls: type, data: dict[str, Any], section: str) -> Any:
    """A plain dataclass part from ``data``: known fields only, each checked against its type."""
    hints, names = typing.get_type_hints(cls), [g.name for g in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise ConfigError(
                f"unknown field '{key}' in {section}{did_you_mean(str(key), names)}; its fields: {', '.join(names)}"
            )
    checked = {
        g.name: _nested(g, data[g.name], hints[g.name], f"{section}.")
        if _is_config(hints[g.name])
        else _coerce(f"{section}.{g.name}", data[g.name], hints[g.name])
        for g in dataclasses.fields(cls)
        if g.name in data
    }
    try:
        return cls(**checked)
    except ConfigError as err:
        raise ConfigError(f"{section}.{err}") from None


class TypedConfig:
    """Base of every config dataclass, a section of a config file or a part composed inside one: its
    fields' types checked when it is built, then its own ``check``; a dict/YAML/JSON round trip;
    did-you-mean on keys. A section a registry chooses by name (a model family by ``model.arch``, a
    task by ``data.task``) names the choosing key in ``selector``: the key is written with the
    fields, and a field the choice does not have is refused naming the choice and listing its fields."""

    section: typing.ClassVar[str] = ""  # 'model', 'train', ...; a part: its path ('model.stack')
    selector: typing.ClassVar[str] = ""  # the key whose value chose this class: 'arch', 'task'; '' if none does
    link: typing.ClassVar[str] = ""  # the class attribute :func:`register` sets to the plug-in: 'family', 'task_class'
    __dataclass_fields__: typing.ClassVar[dict[str, dataclasses.Field[Any]]]  # set by @dataclass on each subclass

    def __post_init__(self) -> None:
        try:
            self._check_types()
            self.check()
        except ConfigError as err:
            raise (_as_written(err, type(self)) if _flat_parts(type(self)) else err) from None

    def check(self) -> None:
        """Value checks across fields, once each field has its type; subclasses extend it (calling
        super().check() where a base checks too)."""

    def _check_types(self) -> None:
        hints = typing.get_type_hints(type(self))
        part = self.section.partition(".")[2]  # a part's fields are named by its path: 'positions.base'
        for f in dataclasses.fields(self):  # configs are frozen: set the checked value underneath
            value, hint = getattr(self, f.name), hints[f.name]
            name = f"{part}.{f.name}" if part else f.name
            checked = _nested(f, value, hint) if _is_config(hint) else _coerce(name, value, hint)
            object.__setattr__(self, f.name, checked)

    @classmethod
    def chosen_name(cls) -> str:
        """The registered name that selects this class (a section with a ``selector``)."""
        name: str = getattr(cls, cls.link).name  # the plug-in that register() linked
        return name

    def to_dict(self) -> dict[str, Any]:
        chosen = {self.selector: self.chosen_name()} if self.selector else {}
        flat = _flat_parts(type(self))
        fields: dict[str, Any] = {}
        for name, value in dataclasses.asdict(self).items():
            fields |= {key: value[key] for key in flat[name]} if name in flat else {name: value}
        return {**chosen, **fields}

    @classmethod
    def field_names(cls) -> list[str]:
        """The keys of a section of this class: its fields, a flattened part's own in the part's place."""
        flat = _flat_parts(cls)
        return [name for f in dataclasses.fields(cls) for name in flat.get(f.name, [f.name])]

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        if not isinstance(data, dict):
            raise ConfigError(f"section '{cls.section}' must be a mapping of field: value (got {type(data).__name__})")
        names = cls.field_names()
        for key in data:
            if key not in names and not (cls.selector and key == cls.selector):
                raise ConfigError(cls._unknown_field(str(key)))
        flat = _flat_parts(cls)
        inner = {name for names_of_part in flat.values() for name in names_of_part}
        fields = {key: value for key, value in data.items() if key in names and key not in inner}
        for part, names_of_part in flat.items():  # a flattened part's fields, given beside the section's own
            given = {key: data[key] for key in names_of_part if key in data}
            if given:
                fields[part] = given
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in fields:
                raise ConfigError(f"section '{cls.section}' needs the field '{f.name}'")
        return cls(**fields)

    @classmethod
    def _unknown_field(cls, key: str) -> str:
        """The line refusing ``key``: where it is written when it is a field of a part inside this
        config (a family's stack: d_model -> stack.d_model), else what is close to it."""
        names = cls.field_names()
        written = {name: name for name in names} | {
            path.rpartition(".")[2]: path for path in field_paths(cls) if "." in path
        }
        if key in written:
            nested = written[key].rpartition(".")[0]
            inside = "".join(f"{part}: {{" for part in nested.split("."))
            return (
                f"{cls.section}.{key} is a field of {cls.section}.{nested}: write it inside {nested} "
                f"({inside}{key}: ...{'}' * (nested.count('.') + 1)}; --set {cls.section}.{written[key]}=...)"
            )
        if cls.selector:
            return (
                f"{cls.section}.{cls.selector} '{cls.chosen_name()}' has no field '{key}'"
                f"{did_you_mean(key, written, written)}; its fields: {', '.join(names)}"
            )
        return f"unknown field '{key}' in section '{cls.section}'{did_you_mean(key, names)}"

    def to_yaml(self) -> str:
        return dump_yaml({self.section: self.to_dict()})

    def to_json(self) -> str:
        return json.dumps({self.section: self.to_dict()}, indent=2)

    @classmethod
    def from_file(cls, path: str | Path) -> Self:
        """Read this class's section from a YAML or JSON config file."""
        sections = read_config_file(path)
        if cls.section not in sections:
            raise ConfigError(f"{path}: no '{cls.section}' section")
        try:
            return cls.from_dict(sections[cls.section])
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None


def register(registry: dict[str, P], plugin: P, what: str) -> P:
    """Add ``plugin`` (a class with ``name`` and a TypedConfig ``config`` with a ``selector``) to ``registry`` under
    its name, and link its config class back to it; another plugin under a taken name is refused."""
    name, config = getattr(plugin, "name"), getattr(plugin, "config")
    if name in registry and registry[name] is not plugin:
        raise ValueError(f"a {what} named '{name}' is already registered ({registry[name]})")
    setattr(config, config.link, plugin)
    registry[name] = plugin
    return plugin


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Parse a config file into its sections, refusing unknown sections and unparsable text."""
    data = parse_file(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping with sections {', '.join(SECTIONS)}")
    for key in data:
        if key not in SECTIONS:
            raise ConfigError(f"{path}: unknown section '{key}'{did_you_mean(str(key), SECTIONS)}")
    return data


def overlaid(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s fields, a mapping in both (a family's stack) overlaid field by field."""
    return base | {
        k: overlaid(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v for k, v in over.items()
    }


def field_paths(cls: type) -> list[str]:
    """A config class's field names, each followed by those of a config inside it as 'stack.n_layers'."""
    hints, paths = typing.get_type_hints(cls), []
    for f in dataclasses.fields(cls):
        if FLAT in f.metadata:  # the part's fields that this section has are written in it
            paths += [path for path in field_paths(hints[f.name]) if path.partition(".")[0] in f.metadata[FLAT]]
            continue
        paths.append(f.name)
        if _is_config(hints[f.name]):
            paths += [f"{f.name}.{inner}" for inner in field_paths(hints[f.name])]
    return paths


def at_least(field: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{field} must be >= {low} (got {value})")


def apply_overrides(
    sections: dict[str, Any],
    overrides: typing.Sequence[str],
    fields_of: typing.Callable[[str, dict[str, Any]], list[str] | None],
) -> None:
    """Apply ``--set section.field=value`` expressions in place (``model.stack.n_layers=4``: a field of
    a config inside the section); values are parsed as YAML scalars.
    A ``--set`` is a line of config given on the command line: whatever is wrong with it (no ``=``, an
    unknown section or field, a value that does not parse) is a ConfigError, as in a file.
    ``fields_of(section, sections)``: the field names a section may have once all overrides are
    applied (a model section's depend on its arch; a nested config's as 'stack.n_layers'), or None
    where that is not known yet."""
    applied = []
    for expr in overrides:
        key, sep, raw = expr.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise ConfigError(f"--set {expr!r}: expected section.field=value, e.g. train.max_steps=100")
        if section not in SECTIONS:
            raise ConfigError(f"--set {expr!r}: unknown section '{section}'{did_you_mean(section, SECTIONS)}")
        try:
            value = parse_yaml(raw) if raw.strip() else None
        except yaml.YAMLError:
            raise ConfigError(f"--set {expr!r}: the value does not parse") from None
        *outer, field = [section, *name.split(".")]  # model.stack.n_layers: the stack inside the model section
        mapping = sections
        for key in outer:
            mapping = mapping.setdefault(key, {})
            if not isinstance(mapping, dict):
                raise ConfigError(f"--set {expr!r}: '{key}' is not a mapping")
        mapping[field] = value
        applied.append((expr, section, name))
    for expr, section, name in applied:
        fields = fields_of(section, sections)
        if fields is not None and name not in fields:
            raise ConfigError(
                f"--set {expr!r}: unknown field '{name}' in section '{section}'{did_you_mean(name, fields)}"
            )


def differences(old: TypedConfig, new: TypedConfig) -> list[str]:
    """The fields of one section that differ, as 'section.field: old -> new' (a nested config's as
    'section.nested.field')."""
    a, b = _flat(old.to_dict()), _flat(new.to_dict())
    return [
        f"{old.section}.{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)
    ]


def _flat(fields: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'stack': {'d_model': 8}} -> {'stack.d_model': 8}."""
    flat: dict[str, Any] = {}
    for name, value in fields.items():
        flat |= _flat(value, f"{prefix}{name}.") if isinstance(value, dict) else {f"{prefix}{name}": value}
    return flat
