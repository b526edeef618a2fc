"""`attnlab train --nproc-per-node N`: N training processes on this machine, started by PyTorch's
elastic launcher (what torchrun runs) once this process has checked the config, so that a bad config
is one line and exit code 3 before any process starts; a rank that fails comes back as its own one
line and exit code (each rank writes it into a folder, errors.RANK_ERRORS, instead of printing),
not as N copies of it and torchrun's ChildFailedError traceback. Plain torchrun stays supported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from attnlab.errors import RANK_ERRORS, AttnlabError


class RankFailed(AttnlabError):
    """A training process's failure: its one line, and its exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def launch(argv: list[str], nproc: int) -> None:
    """Run ``attnlab ARGV`` in ``nproc`` processes (RANK, WORLD_SIZE, MASTER_ADDR... set as torchrun
    sets them, rendezvous on a free local port); raise :class:`RankFailed` with the first failing
    rank's one line and exit code."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"attnlab-{os.getpid()}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
    )
    threads = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc))}  # torchrun's default is 1
    with (
        tempfile.TemporaryDirectory(prefix="attnlab-ranks-") as errors,
        _environment({RANK_ERRORS: errors, **({} if "OMP_NUM_THREADS" in os.environ else threads)}),
        _quiet_launcher(),
    ):
        try:
            elastic_launch(config, sys.executable)("-m", "attnlab.cli", *argv)
        except ChildFailedError as failed:
            raise _first_failure(Path(errors), failed.failures) from None


def _first_failure(errors: Path, failures: dict[int, Any]) -> RankFailed:
    """The lowest rank's own line where one wrote it; else how the first failed process ended."""
    written = sorted(errors.glob("rank-*"), key=lambda f: int(f.name.removeprefix("rank-")))
    if written:
        code, _, message = written[0].read_text().partition("\n")
        return RankFailed(message, int(code))
    rank, failure = min(failures.items())
    how = f"signal {-failure.exitcode}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
    return RankFailed(
        f"training process rank {rank} ended with {how} and no error of its own (see its output above)", 1
    )


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """The environment of the launched processes: ``values`` set, then restored."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _quiet_launcher() -> Iterator[None]:
    """The elastic agent's own log lines (rendezvous, worker groups, its failure report) are for
    cluster operators; a rank's failure is reported by :func:`launch` in one line."""
    logger = logging.getLogger("torch.distributed")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
