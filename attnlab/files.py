"""Atomic writes: a file or a directory appears whole under its name, or not at all.

Each write goes to a temporary name in the same directory, is flushed to disk, and is renamed into
place (rename is atomic on POSIX within one file system), so a crash never leaves half a file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def is_leftover(path: Path) -> bool:
    """A temporary name that a write killed halfway left behind: ``.NAME.XXXX.tmp`` (a file or a
    staging directory) or ``.NAME.XXXX.old`` (a directory being replaced)."""
    return path.name.startswith(".") and path.name.endswith((".tmp", ".old"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; a user's file gets the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def staging_dir(final: str | Path) -> Path:
    """A fresh temporary directory beside ``final``, to fill and then :func:`publish_dir`."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    os.chmod(staged, 0o777 & ~_umask())  # mkdtemp makes it private; a published folder gets the usual mode
    return staged


def publish_dir(staged: Path, final: str | Path) -> None:
    """Move a filled staging directory to ``final``, replacing an older one of that name."""
    final = Path(final)
    for f in staged.rglob("*"):
        if f.is_file():
            with open(f, "rb") as handle:
                os.fsync(handle.fileno())
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
        os.replace(final, old / final.name)
        os.replace(staged, final)
        shutil.rmtree(old)
    else:
        os.replace(staged, final)
