"""The model side of `attnlab serve`: one trained run, asked one input at a time.

An :class:`Explorer` loads a run once and answers :meth:`Explorer.run` requests (plain dicts, as
the JSON API receives them) with the run's output and every attention map that produced it. What
a request reads and how it is answered are the run's task's: its view (attnlab/views/, an
:class:`~attnlab.views.Explorable`) declares the page's fields and answers with the shared steps
of a :class:`~attnlab.views.session.Session`; the explorer checks the request against those
fields, switches heads off and keeps requests one at a time.

Heads named in ``heads_off`` are gated to zero for that request alone (:func:`mask_heads`), which
computes what the model with those heads cut out of its weights computes (``remove_heads``).
Requests share one model, so they run one at a time.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any, Iterator

import torch

from attnlab.analysis.capture import capture_attention
from attnlab.analysis.heads import mask_heads
from attnlab.errors import UsageError
from attnlab.nn.attention import HeadSet, attention_modules
from attnlab.runs.checkpoint import load_run
from attnlab.runs.run_dir import RunDir
from attnlab.serve.runinfo import pruning_report
from attnlab.tasks import TASKS
from attnlab.views import VIEWS, Explorable, tasks_with, view_of
from attnlab.views.limits import LIMITS, Refused
from attnlab.views.session import Session

COMMON = {"run": 0, "text": "", "heads_off": {}}  # the fields every request reads; "run" picks the explorer


class Explorer:
    """One run's model, loaded once; :meth:`run` answers a request, :meth:`info` describes the run."""

    def __init__(
        self,
        run_dir: str | Path,
        checkpoint: str = "best",
        device: torch.device | str = "cpu",
        allow_files: bool = False,
    ) -> None:
        self.run_dir = RunDir(run_dir)
        self.name = self.run_dir.path.name
        model_cfg, data_cfg, _ = self.run_dir.read_config()  # "not a run directory" comes from here
        self.task = data_cfg.task.name
        view = view_of(data_cfg.task)
        if not isinstance(view, Explorable) or not (
            model_cfg.capabilities.attention_weights or model_cfg.capabilities.decoder
        ):
            raise UsageError(
                f"{run_dir} is a run of data.task '{self.task}' with arch '{model_cfg.arch}'; "
                f"`attnlab serve` explores runs with attention of data.task "
                f"{', '.join(map(repr, tasks_with(Explorable)))}"
            )
        self.view = view
        model, tokenizers, self.cfg = load_run(run_dir, checkpoint, device)
        try:  # a backend that forms no weights ('local', 'sparse', 'linear') is refused now, not per request
            with capture_attention(model):
                pass
        except ValueError as err:
            raise UsageError(f"{run_dir}: {err}") from None
        self.model = model
        self.session = Session(
            self.run_dir,
            model,
            tokenizers,
            self.cfg,
            self.run_dir.read_shape(),
            data_cfg,
            next(model.parameters()).device,
            allow_files,
        )
        self.lock = threading.Lock()
        self.example = view.example(self.run_dir, tokenizers)

    def info(self) -> dict[str, Any]:
        """The run as the page shows it: name, family, task, its page (input kind, fields, how its
        outputs are drawn), maskable modules, pruning, first input."""
        return {
            "path": str(self.run_dir.path),
            "name": self.name,
            "arch": self.cfg.arch,
            "task": self.task,
            "files_allowed": self.session.allow_files,
            **self.view.page.describe(),
            "modules": {name: m.n_heads for name, m in attention_modules(self.model).items()},
            "pruning": pruning_report(self.run_dir),
            "example": self.example,
        }

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one request: {text, heads_off: {module: [heads]}, and the fields of the task's page}."""
        options = self._options(request)
        text = options.pop("text")
        heads_off = self._heads(options.pop("heads_off"))
        with self.lock, self._masked(heads_off), torch.no_grad():
            result = self.view.answer(self.session, text, **options)
        return {"run": self.name, "task": self.task, "heads_off": heads_off, **result}

    # -- reading a request ------------------------------------------------------------------------
    def _options(self, request: dict[str, Any]) -> dict[str, Any]:
        """The request's fields, checked, with the page's defaults filled in ("run" dropped)."""
        fields = COMMON | self.view.page.fields
        if "question" in request and "question" not in fields:
            asking = [
                name
                for name, task in TASKS.items()
                if isinstance(view := VIEWS.get(task), Explorable) and "question" in view.page.fields
            ]
            raise Refused(
                f"{self.name} is a {self.task} run, which answers no question; ask a {' or '.join(asking)} run"
            )
        unknown = sorted(set(request) - set(fields))
        if unknown:
            raise Refused(f"unknown field {unknown[0]!r}; a {self.task} run reads {', '.join(fields)}")
        options = {name: request.get(name, default) for name, default in fields.items() if name != "run"}
        for name, value in options.items():
            kind = type(fields[name])
            if kind is float and type(value) is int:
                value = options[name] = float(value)
            if type(value) is not kind:
                raise Refused(
                    f"{name} must be {kind.__name__ if kind is not dict else 'an object'} (got {json.dumps(value)})"
                )
        if len(options["text"]) > LIMITS.max_chars:
            raise Refused(
                f"the input has {len(options['text']):,} characters; the explorer takes at most {LIMITS.max_chars:,}",
                status=413,
            )
        upload = self.view.page.upload
        if upload is None:
            if not options["text"].strip():
                raise Refused("the input is empty; type a sentence")
            return options
        name, thing, file = upload
        if options["text"].strip() and options[name]:
            raise Refused(f"give {thing} uploaded or {file}'s path, not both")
        if not (options["text"].strip() or options[name]):
            raise Refused(f"the input is empty; upload {thing}, or give {file}'s path on the server")
        return options

    def _heads(self, heads_off: dict[str, Any]) -> HeadSet:
        """``heads_off`` checked against the model's modules: {module: sorted head indices}."""
        modules = attention_modules(self.model)
        checked: HeadSet = {}
        for name, heads in heads_off.items():
            if name not in modules:
                raise Refused(f"heads_off: no attention module {name!r} (modules: {', '.join(modules)})")
            n = modules[name].n_heads
            if not isinstance(heads, list) or any(type(h) is not int or not 0 <= h < n for h in heads):
                raise Refused(
                    f"heads_off[{name!r}] must be a list of head indices 0..{n - 1} (got {json.dumps(heads)})"
                )
            if heads:
                checked[name] = sorted(set(heads))
        return checked

    @contextlib.contextmanager
    def _masked(self, heads: HeadSet) -> Iterator[None]:
        """These heads gated to zero inside the block, on the model's device; no gate after it."""
        mask_heads(self.model, heads)
        for module in attention_modules(self.model).values():
            if module.head_gate is not None:
                module.head_gate = module.head_gate.to(self.session.device)
        try:
            yield
        finally:
            mask_heads(self.model, {})
