"""What `attnlab serve` says of a run besides its answers: the page's first input, taken from the
run's validation data, and what `attnlab prune --out` recorded in a pruned run."""

from __future__ import annotations

import json
from typing import Any

from attnlab.errors import AttnlabError
from attnlab.runs.run_dir import META_FILE, RunDir
from attnlab.runs.data import read_run_data

EXAMPLE_TOKENS = 48  # of a language model's validation text: the page's first input


def example_input(run: RunDir, task: str, tokenizers: dict[str, Any]) -> str | None:
    """The page's first input: the first source sentence of the run's validation data (a
    translation), its first text (a classifier), or the start of its first line (a language
    model); None where the run has no data here (an import, files since moved) or its input is not
    a sentence."""
    if task not in ("translation", "classification", "language_model"):
        return None
    try:
        first = read_run_data(run, "valid").splits["valid"][0:EXAMPLE_TOKENS]
    except AttnlabError:
        return None
    if task == "translation":
        return first[0].src
    if task == "classification":
        return tokenizers["src"].decode(first[0].ids)
    lines = tokenizers["tgt"].decode(first.tolist()).splitlines()  # a character LM's text runs across lines
    return next((line.strip() for line in lines if line.strip()), None)


def pruning_report(run: RunDir) -> dict[str, Any] | None:
    """What `attnlab prune --out` recorded in a pruned run: the heads cut out, the run they were cut
    from, and the measurements of the pruned model; None for a run that was not pruned."""
    heads = run.read_pruned_heads()
    if not heads:
        return None
    step = run.best_step() or run.steps()[-1]
    try:
        meta = json.loads((run.step_dir(step) / META_FILE).read_text())
    except (OSError, ValueError):
        meta = {}
    return {"pruned_heads": heads, **{k: v for k, v in meta.items() if k != "step"}}
