"""The exceptions a user may see. Everything else that escapes is a bug in attnlab.

Each class has its own exit code so that scripts can tell a bad config from a bad file; the CLI
prints ``error: <message>`` on one line and exits with that code (``--debug`` shows the traceback).
docs/reliability.md's "When something is wrong" is the table of these codes that every command follows.
"""

from __future__ import annotations

# Set by `attnlab train --nproc-per-node` (parallel/launch.py) for the processes it starts: a folder where a
# failing rank writes its exit code and one line (cli/main.py) for the launcher to report once.
RANK_ERRORS = "ATTNLAB_RANK_ERRORS"


class AttnlabError(Exception):
    """Base of every user-facing error: the message alone must tell the user what to fix."""

    exit_code = 1


class UsageError(AttnlabError):
    """A command line that cannot be carried out (bad option values, missing arguments)."""

    exit_code = 2


class ConfigError(AttnlabError, ValueError):
    """A config file or ``--set`` that cannot be read, or a field that is unknown, mistyped or out of
    range; the message names it."""

    exit_code = 3


class DataError(AttnlabError):
    """An input file that cannot be read as promised; the message names the file and line."""

    exit_code = 4


class CheckpointError(AttnlabError):
    """A run directory that is not one, or a checkpoint that is missing, damaged or does not match the
    model it is loaded into."""

    exit_code = 5


class NumericalError(AttnlabError):
    """Training that cannot go on: the loss or the gradients stayed non-finite (NaN or inf)."""

    exit_code = 6


class Interrupted(AttnlabError):
    """Ctrl-C: the message says what was saved and how to go on. 130 = 128 + SIGINT, as shells use."""

    exit_code = 130
