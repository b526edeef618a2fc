"""The text of config files and of the small files a run keeps beside them: YAML, with YAML 1.2's
floats (``3e-3`` a number), or JSON for a ``.json`` name; a missing, unreadable or unparsable file is
one ConfigError naming it and, where the parser knows it, the line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from attnlab.errors import ConfigError

YAML12_FLOAT = re.compile(
    r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
    r"|[0-9][0-9_]*[eE][-+]?[0-9]+|\.(?:inf|Inf|INF|nan|NaN|NAN))$"
)


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, with YAML 1.2 floats: ``3e-3`` and ``1E5`` are numbers, not strings
    (YAML 1.1, PyYAML's default, wants a dot: ``3.0e-3``)."""


class ConfigDumper(yaml.SafeDumper):
    """Writes what ConfigLoader reads back: a string such as ``1e5`` is quoted, since unquoted it
    would now read as a number."""


for _yaml_class in (ConfigLoader, ConfigDumper):
    _yaml_class.add_implicit_resolver("tag:yaml.org,2002:float", YAML12_FLOAT, list("-+0123456789."))


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=ConfigLoader)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=ConfigDumper, sort_keys=False)


def parse_file(path: str | Path, what: str = "config file") -> Any:
    """The YAML (or, for a .json name, JSON) of ``path``; a missing, unreadable or unparsable file
    is one ConfigError naming it (and the line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read {what} ({err})") from None
    try:
        return json.loads(text) if path.suffix == ".json" else parse_yaml(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}:{err.lineno}: JSON does not parse: {err.msg}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: YAML does not parse: {getattr(err, 'problem', None) or err}") from None
