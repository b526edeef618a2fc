"""What `attnlab serve` says of a run besides its answers: what `attnlab prune --out` recorded in
a pruned run. (The page's first input is the run's task's: its view's ``example``.)"""

from __future__ import annotations

import json
from typing import Any

from attnlab.runs.checkpoint_files import META_FILE
from attnlab.runs.run_dir import RunDir


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
