"""A sweep spec (the format: attnlab/analysis/sweep.py) read and checked: the base config(s), the
overrides of every run, the grid's axes (a joint axis sets several fields together), the seeds,
the step budget, the evaluation; the cells, every combination of the grid's values; and a run of
the sweep (PlannedRun: a cell and a seed, where it trains, how far it got, its scores)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from attnlab.config import did_you_mean
from attnlab.config_files import parse_file, parse_yaml
from attnlab.errors import ConfigError

CONFIG_AXIS = "config"
SPEC_FIELDS = ("config", "set", "grid", "seeds", "steps", "evaluate", "metrics", "jobs")
Scalar = str | int | float | bool | None


# -- the spec ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    """``attnlab evaluate RUN --split SPLIT --json ARGS`` after training; its scores are the run's."""

    split: str
    args: tuple[str, ...] = ()

    def argv(self, run: Path) -> list[str]:
        return ["evaluate", str(run), "--split", self.split, "--json", *self.args]


@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep spec (the module's docstring has the format)."""

    path: Path
    configs: tuple[str, ...]
    sets: tuple[str, ...]
    grid: tuple[tuple[str, tuple[Any, ...]], ...]  # (axis, values) in the spec's order
    seeds: tuple[int, ...]
    steps: int | None = None
    evaluate: Evaluation | None = None
    metrics: tuple[str, ...] = ()
    jobs: int = 1

    @classmethod
    def from_file(cls, path: str | Path) -> "SweepSpec":
        path = Path(path)
        sections = parse_file(path, "sweep spec")
        if not isinstance(sections, dict) or set(sections) != {"sweep"} or not isinstance(sections["sweep"], dict):
            raise ConfigError(
                f"{path}: a sweep spec is one mapping, 'sweep:', with the fields {', '.join(SPEC_FIELDS)}"
            )
        try:
            return cls.from_dict(path, sections["sweep"])
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None

    @classmethod
    def from_dict(cls, path: Path, spec: dict[str, Any]) -> "SweepSpec":
        for key in spec:
            if key not in SPEC_FIELDS:
                raise ConfigError(f"unknown field 'sweep.{key}'{did_you_mean(str(key), SPEC_FIELDS)}")
        if "config" not in spec:
            raise ConfigError("sweep.config: the base config file is missing")
        configs = _strings("sweep.config", spec["config"])
        grid = _grid(spec.get("grid") or {})
        if len(configs) > 1:
            grid = ((CONFIG_AXIS, configs), *grid)
        seeds = spec.get("seeds", 1)
        if isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 1:
            seeds = list(range(1, seeds + 1))
        if (
            not isinstance(seeds, list)
            or not seeds
            or not all(_is_int(s) for s in seeds)
            or len(set(seeds)) < len(seeds)
        ):
            raise ConfigError(
                f"sweep.seeds must be a number of seeds (>= 1) or a list of distinct integers (got {seeds!r})"
            )
        steps = spec.get("steps")
        if steps is not None and not (_is_int(steps) and steps >= 1):
            raise ConfigError(f"sweep.steps must be a number of steps >= 1 (got {steps!r})")
        jobs = spec.get("jobs", 1)
        if not (_is_int(jobs) and jobs >= 1):
            raise ConfigError(f"sweep.jobs must be an integer >= 1 (got {jobs!r})")
        checked = cls(
            path,
            configs,
            _strings("sweep.set", spec.get("set") or []),
            grid,
            tuple(seeds),
            steps,
            _evaluation(spec.get("evaluate")),
            _strings("sweep.metrics", spec.get("metrics") or []),
            jobs,
        )
        _refuse_shared_names(checked.cells())
        return checked

    @property
    def axes(self) -> list[str]:
        return [axis for axis, _ in self.grid]

    def cells(self) -> list["Cell"]:
        """Every combination of the grid's values, the first axis slowest."""
        combos = itertools.product(*(values for _, values in self.grid))
        return [Cell(tuple(zip(self.axes, combo)), _short_names(self.axes)) for combo in combos]


def _refuse_shared_names(cells: list["Cell"]) -> None:
    """Each cell's name is its run directory: two cells with one name would train into one folder."""
    first: dict[str, Cell] = {}
    for cell in cells:
        other = first.setdefault(cell.name, cell)
        if other is not cell:
            values = [", ".join(f"{field}={v}" for field, v in c.settings()) for c in (other, cell)]
            raise ConfigError(
                f"sweep: the cells {values[0]} and {values[1]} would share the run directory "
                f"'{cell.name}' (a config's file name and each value's words make it); rename one"
            )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _strings(field: str, value: Any) -> tuple[str, ...]:
    values = [value] if isinstance(value, str) else value
    if (
        not isinstance(values, list)
        or not all(isinstance(v, str) and v for v in values)
        or not values
        and field == "sweep.config"
    ):
        raise ConfigError(f"{field} must be a string or a list of strings (got {value!r})")
    return tuple(values)


def _grid(grid: Any) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """The grid's axes: ``section.field: [values]``, or a joint axis ``a.x,b.y: [[x1, y1], [x2, y2]]``
    whose fields change together."""
    if not isinstance(grid, dict):
        raise ConfigError(f"sweep.grid must map config fields (section.field) to lists of values (got {grid!r})")
    axes = []
    for axis, values in grid.items():
        fields = axis_fields(str(axis))
        for field in fields:
            section, dot, name = field.partition(".")
            if not dot or section not in ("model", "data", "train") or not name:
                raise ConfigError(
                    f"sweep.grid: '{field}' is not a config field (section.field, e.g. model.stack.n_heads)"
                )
            if field in ("train.seed", "train.max_steps"):
                raise ConfigError(
                    f"sweep.grid: {field} is set by sweep.{'seeds' if field == 'train.seed' else 'steps'}"
                )
        if not isinstance(values, list) or not values or len(set(map(repr, values))) < len(values):
            raise ConfigError(f"sweep.grid.{axis} must be a list of distinct values (got {values!r})")
        for value in values:
            each = value if len(fields) > 1 and isinstance(value, list) and len(value) == len(fields) else [value]
            if len(fields) > 1 and each == [value] or any(isinstance(v, (list, dict)) for v in each):
                wanted = (
                    f"a list of {len(fields)} values, one per field"
                    if len(fields) > 1
                    else "a number, a string, true/false or null"
                )
                raise ConfigError(f"sweep.grid.{axis}: each value must be {wanted} (got {value!r})")
        axes.append((str(axis), tuple(tuple(v) if len(fields) > 1 else v for v in values)))
    return tuple(axes)


def axis_fields(axis: str) -> list[str]:
    """The config fields an axis sets: one, or several joined by commas."""
    return [field.strip() for field in axis.split(",")]


def _evaluation(value: Any) -> Evaluation | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = {"split": value}
    if not isinstance(value, dict) or not isinstance(value.get("split"), str) or set(value) - {"split", "args"}:
        raise ConfigError(f"sweep.evaluate must be a split name or {{split: NAME, args: [...]}} (got {value!r})")
    args = value.get("args") or []
    if not isinstance(args, list) or any(isinstance(a, (list, dict)) for a in args):
        raise ConfigError(f"sweep.evaluate.args must be a list of command-line words (got {args!r})")
    return Evaluation(value["split"], tuple(_word(a) for a in args))


def _word(value: Scalar) -> str:
    """A YAML scalar written as ``--set`` and the command line read it back."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, str):
        return value if parse_yaml(value) == value else json.dumps(value)
    return repr(value)


def _short_names(axes: Sequence[str]) -> dict[str, str]:
    """Each field as a run directory names it: its last name alone (model.stack.n_heads: n_heads), or
    in full where two axes share it."""
    fields = [field for axis in axes for field in axis_fields(axis)]
    names = [field.rpartition(".")[2] for field in fields]
    return {field: name if names.count(name) == 1 else field for field, name in zip(fields, names)}


@dataclass(frozen=True)
class Cell:
    """One combination of the grid's values (a joint axis's value is a tuple)."""

    values: tuple[tuple[str, Any], ...]
    short: dict[str, str]

    def __hash__(self) -> int:
        return hash(self.values)

    def settings(self) -> list[tuple[str, Scalar]]:
        """(field, value) of every field the cell sets, joint axes spread out."""
        return [
            pair
            for axis, v in self.values
            for pair in (zip(axis_fields(axis), v) if isinstance(v, tuple) else [(axis, v)])
        ]

    @property
    def name(self) -> str:
        if not self.values:
            return "base"
        parts = [
            f"{self.short[field]}={Path(str(v)).stem if field == CONFIG_AXIS else _word(v)}"
            for field, v in self.settings()
        ]
        return "".join(c if c.isalnum() or c in "._=,+-" else "_" for c in ",".join(parts))

    def value(self, axis: str) -> Any:
        return dict(self.values)[axis]

    def shown(self, axis: str) -> str:
        """The axis's value as the table writes it."""
        v = self.value(axis)
        return ", ".join(map(_word, v)) if isinstance(v, tuple) else _word(v)

    def overrides(self) -> list[str]:
        return [f"{field}={_word(v)}" for field, v in self.settings() if field != CONFIG_AXIS]


# -- the runs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedRun:
    cell: Cell
    seed: int
    config: str
    sets: tuple[str, ...]
    path: Path

    @property
    def name(self) -> str:
        return f"{self.cell.name}/seed{self.seed}"

    @property
    def evaluation_file(self) -> Path:
        return self.path / "sweep_evaluation.json"

    def state(self, evaluate: Evaluation | None) -> str:
        """'finished', 'evaluate' (trained, not yet scored), 'resume' (stopped) or 'train' (not begun)."""
        if (self.path / "summary.json").is_file():
            if evaluate is None or self.evaluated_with(evaluate):
                return "finished"
            return "evaluate"
        return "resume" if (self.path / "config.yaml").is_file() else "train"

    def evaluated_with(self, evaluate: Evaluation) -> bool:
        try:
            return bool(json.loads(self.evaluation_file.read_text())["argv"] == evaluate.argv(self.path))
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def scores(self, evaluate: Evaluation | None) -> dict[str, float]:
        """The run's numeric scores: its evaluation's, named SPLIT_SCORE (test_exact_match), then
        its summary's (best_* and the last validation's)."""
        summary = json.loads((self.path / "summary.json").read_text())
        found = {**summary.get("last_eval", {}), **summary}
        if evaluate is not None:
            result = json.loads(self.evaluation_file.read_text())["result"]
            found = {f"{evaluate.split}_{k}": v for k, v in result.items()} | found
        return {k: float(v) for k, v in found.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
