"""Views: what each task shows of its runs in `attnlab serve` and `attnlab inspect`, one module per
task (or per kind of task: views/encoder.py serves a masked LM and an imported encoder), each
registering with its task's class (views/view.py). They sit above analysis/ and below serve/ (the
layers contract in pyproject.toml): a view composes analysis's figures and the explorer's shared
steps (views/session.py), and serve/ and the inspect command find a run's view by its task, never
by a name. Adding a task's view is one new module here: the package imports every module of its
folder, so it registers itself; from outside the package, any module that calls ``register_view``
before the run is served or inspected."""

import importlib
import pkgutil

from attnlab.views.view import (
    VIEWS,
    Explorable,
    Inspectable,
    Inspection,
    Page,
    inspect_run,
    register_view,
    tasks_with,
    view_of,
)

for _module in pkgutil.iter_modules(__path__):  # each task's view registers itself
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "VIEWS",
    "Explorable",
    "Inspectable",
    "Inspection",
    "Page",
    "inspect_run",
    "register_view",
    "tasks_with",
    "view_of",
]
