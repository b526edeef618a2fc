"""Settings for the whole test session.

- Subprocesses (the command-line program, torchrun workers, `python -c` scripts) import attnlab
  from this checkout: the repository root is put first on PYTHONPATH, so the suite runs from a
  plain clone whether or not the package is installed (tests/helpers.py: ATTNLAB, TORCHRUN).
- Hypothesis runs derandomised (profile "ci", the default): every run tries the same examples, so
  a pass or a failure repeats; examples a fresh draw once found are pinned with @example in the
  tests. `HYPOTHESIS_PROFILE=explore` draws fresh examples (and keeps failures in .hypothesis/).
- Devices: every test runs on the CPU, on a GPU machine too, except those marked ``cuda`` (below).
- Threads: every process of the suite (this one and the subprocesses it starts) computes on one
  thread. On 2 cores with another process busy, PyTorch's two threads wait on each other: 71 tests
  of test_train, test_golden and test_rnn took 582 s that way against 90 s on one thread, and 34 s
  against 40 s with nothing else running (issue 37, item 11: the suite took 18 min 47 s on a loaded
  machine).
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported: its thread pools read it once

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

torch.set_num_threads(1)  # in case a plug-in imported torch first
ROOT = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

settings.register_profile("ci", derandomize=True, database=None, max_examples=150, deadline=None)
settings.register_profile("explore", derandomize=False, max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# -- devices: the suite checks the same numbers on a GPU machine as on the CPU-only CI ---------------
# Every test runs on the CPU ('auto' finds no GPU), in this process and in the subprocesses it starts,
# except those marked `cuda`, which see the GPUs (and are skipped where there is none). The CUDA
# runtime of this process starts before CUDA_VISIBLE_DEVICES is emptied, so it keeps seeing the GPUs
# that subprocesses no longer do. pytest-xdist's workers are subprocesses too: the first process
# leaves the GPUs it saw in SUITE_GPUS, and a worker's conftest puts them back before it counts them.
SUITE_GPUS, UNSET = "ATTNLAB_SUITE_CUDA_VISIBLE_DEVICES", "<unset>"
if os.environ.get(SUITE_GPUS) == UNSET:
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
elif SUITE_GPUS in os.environ:
    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ[SUITE_GPUS]
GPUS = torch.cuda.device_count()
if GPUS:
    torch.cuda.init()  # the runtime reads CUDA_VISIBLE_DEVICES once, here
VISIBLE_GPUS = os.environ.get("CUDA_VISIBLE_DEVICES")
os.environ[SUITE_GPUS] = UNSET if VISIBLE_GPUS is None else VISIBLE_GPUS
os.environ["CUDA_VISIBLE_DEVICES"] = ""


@pytest.fixture(autouse=True, scope="session")
def no_gpu_in_this_process():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "device_count", lambda: 0)
        patch.setattr(torch.cuda, "is_available", lambda: False)
        yield


@pytest.fixture(autouse=True)
def gpus_for_cuda_tests(request, monkeypatch):
    """A test marked `cuda` sees the GPUs, here and in its subprocesses; without one it is skipped."""
    if request.node.get_closest_marker("cuda") is None:
        return
    if GPUS == 0:
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: GPUS)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    if VISIBLE_GPUS is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", VISIBLE_GPUS)
