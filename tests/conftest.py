"""Settings for the whole test session.

- Subprocesses (the command-line program, torchrun workers, `python -c` scripts) import attnlab
  from this checkout: the repository root is put first on PYTHONPATH, so the suite runs from a
  plain clone whether or not the package is installed (tests/helpers.py: ATTNLAB, TORCHRUN).
- Hypothesis runs derandomised (profile "ci", the default): every run tries the same examples, so
  a pass or a failure repeats; examples a fresh draw once found are pinned with @example in the
  tests. `HYPOTHESIS_PROFILE=explore` draws fresh examples (and keeps failures in .hypothesis/).
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

settings.register_profile("ci", derandomize=True, database=None, max_examples=150, deadline=None)
settings.register_profile("explore", derandomize=False, max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
